"""The training script of benchmarks/driver_restart.py: er_train.py's model and events,
trained until the benchmark says where to stop, so that a trial lasts as long as its
driver's loss and return take on this machine.

Env (besides model.py's and kit.py's): BENCH_COMMIT_EVERY, BENCH_STOP_FILE (holds a step
number, written well ahead of it: every rank stops after that step, at the same one).
Events: "synced" (each entry into the elastic function: the step it starts from; a second
one on a worker is a rollback), "step" (rank, round, step), "done".
"""

from __future__ import annotations

import kit
from kit import emit
from model import batch, elastic_setup, train_step

import elasticrun.torch as er
from elasticrun.torch.world import runtime

COMMIT_EVERY = kit.env_int("BENCH_COMMIT_EVERY", 10)
STOP_FILE = kit.env_path("BENCH_STOP_FILE")


def stop_step() -> float:
    try:
        return int(STOP_FILE.read_text())
    except (OSError, ValueError):
        return float("inf")


def main() -> None:
    model, optimizer, state = elastic_setup(er.elastic.TorchState)
    er.init()
    data, target = batch(er.rank())

    @er.elastic.run
    def train(state: er.elastic.TorchState) -> None:
        emit("synced", rank=er.rank(), size=er.size(), step=state.step,
             round=runtime.current().round)
        while state.step < stop_step():
            train_step(model, optimizer, data, target)
            state.step += 1
            if kit.due(state.step, COMMIT_EVERY):
                state.commit()
            emit("step", rank=er.rank(), step=state.step, round=runtime.current().round)

    train(state)
    emit("done", rank=er.rank())
    er.shutdown()


if __name__ == "__main__":
    main()
