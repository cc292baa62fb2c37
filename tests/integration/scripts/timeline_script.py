"""A Horovod-style script that starts the timeline itself: `start_timeline(path)` on every
rank, a few training steps with commits, `stop_timeline()`.

Env: TIMELINE_PATH (unset: the script never starts it); OUT_DIR: each rank writes what it
saw to OUT_DIR/rank<N>.json: whether the timeline was on at init, the error a second path
gave, whether it was on after stop_timeline.
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F

import elasticrun.torch as er
from elasticrun.worker import timeline


def main() -> None:
    er.init()
    seen: dict[str, object] = {"on_at_init": timeline.enabled()}
    path = os.environ.get("TIMELINE_PATH")
    if path:
        er.start_timeline(path)
        er.start_timeline(path)  # every rank calls it, more than once: the same file
        try:
            er.start_timeline(path + ".other.json")
            seen["other_path"] = ""
        except ValueError as exc:
            seen["other_path"] = str(exc)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    optimizer = er.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                        named_parameters=model.named_parameters())
    state = er.elastic.TorchState(model, optimizer, step=0)

    @er.elastic.run
    def train(state: er.elastic.TorchState) -> None:
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        while state.step < 4:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            state.step += 1
            state.commit()

    train(state)
    er.stop_timeline()
    seen["on_after_stop"] = timeline.enabled()
    with open(os.path.join(os.environ["OUT_DIR"], f"rank{er.rank()}.json"), "w") as file:
        json.dump(seen, file)
    er.shutdown()


if __name__ == "__main__":
    main()
