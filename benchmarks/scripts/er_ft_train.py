"""The elasticrun side of the torchft comparison: er_train.py's model and loop with
failure.py's failure, committing every BENCH_COMMIT_EVERY steps.

Events: "started", "imported", "synced" (state synced, step restored), "step",
"failure" (a collective raised: the step in flight is lost), the failure's own event,
"done".
"""

from __future__ import annotations

import time

STARTED = time.time()
# ruff: noqa: E402  (the imports come after STARTED: a benchmark times them)

import kit
import torch.nn.functional as F
from failure import FAIL_RANK, FAIL_STEP, fail
from kit import emit
from model import STEPS, batch, elastic_setup

import elasticrun.torch as er

COMMIT_EVERY = kit.env_int("BENCH_COMMIT_EVERY", 10)


def main() -> None:
    emit("started", at=STARTED)
    model, optimizer, state = elastic_setup(er.elastic.TorchState)
    emit("imported")
    er.init()

    @er.elastic.run
    def train(state: er.elastic.TorchState) -> None:
        data, target = batch(er.rank())
        emit("synced", rank=er.rank(), size=er.size(), step=state.step)
        while state.step < STEPS:
            try:
                optimizer.zero_grad()
                loss = F.cross_entropy(model(data), target)
                if state.step == FAIL_STEP and er.rank() == FAIL_RANK:
                    fail(er.rank(), state.step)
                loss.backward()
                optimizer.step()
                state.step += 1
                if kit.due(state.step, COMMIT_EVERY):
                    state.commit()
            except er.elastic.HostsUpdatedInterrupt:
                raise
            except Exception:
                emit("failure", rank=er.rank(), step=state.step)
                raise
            emit("step", rank=er.rank(), size=er.size(), step=state.step)

    train(state)
    emit("done", rank=er.rank(), params=kit.parameter_count(model))
    er.shutdown()


if __name__ == "__main__":
    main()
