"""The training script of benchmarks/driver_restart.py: er_train.py's model and events,
trained until the benchmark says where to stop, so that a trial lasts as long as its
driver's loss and return take on this machine.

Env (besides model.py's): BENCH_COMMIT_EVERY, BENCH_STOP_FILE (holds a step number, written
well ahead of it: every rank stops after that step, at the same one).
Events: "synced" (each entry into the elastic function: the step it starts from; a second
one on a worker is a rollback), "step" (rank, round, step), "done".
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
from model import batch, build_model, emit

import elasticrun.torch as er
from elasticrun.torch.world import runtime

COMMIT_EVERY = int(os.environ.get("BENCH_COMMIT_EVERY", "10"))
STOP_FILE = Path(os.environ["BENCH_STOP_FILE"])


def stop_step() -> float:
    try:
        return int(STOP_FILE.read_text())
    except (OSError, ValueError):
        return float("inf")


def main() -> None:
    model = build_model()
    optimizer = er.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                        named_parameters=model.named_parameters())
    state = er.elastic.TorchState(model, optimizer, step=0)
    er.init()
    data, target = batch(er.rank())

    @er.elastic.run
    def train(state: er.elastic.TorchState) -> None:
        emit("synced", rank=er.rank(), size=er.size(), step=state.step,
             round=runtime.current().round)
        while state.step < stop_step():
            optimizer.zero_grad()
            F.cross_entropy(model(data), target).backward()
            optimizer.step()
            state.step += 1
            if state.step % COMMIT_EVERY == 0:
                state.commit()
            emit("step", rank=er.rank(), step=state.step, round=runtime.current().round)

    train(state)
    emit("done", rank=er.rank())
    er.shutdown()


if __name__ == "__main__":
    main()
