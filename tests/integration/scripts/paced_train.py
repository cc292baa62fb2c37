"""An elasticrun.torch script (er.init, a commit every step) with a "device time" per step
the test changes per worker: see paced_control.py."""

from __future__ import annotations

import paced_control as ctl
import torch

import elasticrun.torch as er


def main() -> None:
    args = ctl.parse()
    er.init()
    model = torch.nn.Linear(16, 16)
    optimizer = er.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                        named_parameters=model.named_parameters())
    state = er.elastic.TorchState(model=model, optimizer=optimizer, step=0)

    @er.elastic.run
    def train(state: er.elastic.TorchState) -> None:
        while state.step < args.steps:
            if er.allreduce(ctl.stopping(args.control), op=er.Sum, name="stop").item() > 0:
                break
            ctl.device_time(args.control, args.step_s)
            optimizer.zero_grad()
            model(ctl.batch(state.step)).pow(2).mean().backward()
            optimizer.step()
            state.step += 1
            state.commit()
            ctl.said(state.step, er.rank(), er.size())

    train(state)


if __name__ == "__main__":
    main()
