"""The elastic training script of benchmarks/total_loss.py: model.py's MLP and batch, SGD with
momentum (so that the commit holds optimizer state as large as the model) through
er.DistributedOptimizer, and an er.elastic.TorchState committed every BENCH_COMMIT_EVERY steps.

Env (besides model.py's BENCH_PARAMS, BENCH_STEPS and kit.py's BENCH_OUT): BENCH_COMMIT_EVERY,
BENCH_KILL_STEP with BENCH_MARKER_DIR: every rank SIGKILLs itself at the start of that step,
once per rank in the job (a marker file per rank), so that every worker of the round is gone
at once and the job can only go on from a kept commit.
Events: "started" (first line, before torch is imported), "synced" (each entry into the
elastic function: the step it starts from), "kill", "step" (with the commit's duration),
"done".
"""

from __future__ import annotations

import time

STARTED = time.time()
# ruff: noqa: E402  (the imports come after STARTED: a benchmark times them)

import kit
from kit import emit
from model import STEPS, batch, elastic_setup, train_step

import elasticrun.torch as er
from elasticrun.torch.world import runtime

COMMIT_EVERY = kit.env_int("BENCH_COMMIT_EVERY", 10)
MARKER_DIR = kit.env_path("BENCH_MARKER_DIR", "/tmp")


def main() -> None:
    emit("started", at=STARTED)
    model, optimizer, state = elastic_setup(er.elastic.TorchState, momentum=0.9)
    er.init()
    data, target = batch(er.rank())

    @er.elastic.run
    def train(state: er.elastic.TorchState) -> None:
        emit("synced", rank=er.rank(), size=er.size(), step=state.step,
             round=runtime.current().round)
        while state.step < STEPS:
            if state.step == kit.KILL_STEP \
                    and kit.first_time(MARKER_DIR / f"killed-{er.rank()}"):
                kit.signal_self("kill", rank=er.rank(), step=state.step)
            train_step(model, optimizer, data, target)
            state.step += 1
            commit_s = kit.timed(state.commit) if kit.due(state.step, COMMIT_EVERY) else 0.0
            emit("step", rank=er.rank(), step=state.step, round=runtime.current().round,
                 commit_s=commit_s)

    train(state)
    emit("done", rank=er.rank(), params=kit.parameter_count(model))
    er.shutdown()


if __name__ == "__main__":
    main()
