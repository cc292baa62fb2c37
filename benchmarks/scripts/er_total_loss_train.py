"""The elastic training script of benchmarks/total_loss.py: model.py's MLP and batch, SGD with
momentum (so that the commit holds optimizer state as large as the model) through
er.DistributedOptimizer, and an er.elastic.TorchState committed every BENCH_COMMIT_EVERY steps.

Env (besides model.py's BENCH_PARAMS, BENCH_OUT, BENCH_STEPS): BENCH_COMMIT_EVERY,
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

import os  # noqa: E402
import signal  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from model import STEPS, batch, build_model, emit, parameter_count  # noqa: E402

import elasticrun.torch as er  # noqa: E402
from elasticrun.torch.world import runtime  # noqa: E402

COMMIT_EVERY = int(os.environ.get("BENCH_COMMIT_EVERY", "10"))
KILL_STEP = int(os.environ.get("BENCH_KILL_STEP", "-1"))
MARKER_DIR = Path(os.environ.get("BENCH_MARKER_DIR", "/tmp"))


def kill_once(step: int) -> None:
    """At KILL_STEP, the first time this rank gets there in the job: SIGKILL itself."""
    if step != KILL_STEP:
        return
    try:
        os.close(os.open(MARKER_DIR / f"killed-{er.rank()}", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return
    emit("kill", rank=er.rank(), step=step)
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    emit("started", at=STARTED)
    model = build_model()
    optimizer = er.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        named_parameters=model.named_parameters())
    state = er.elastic.TorchState(model, optimizer, step=0)
    er.init()
    data, target = batch(er.rank())

    @er.elastic.run
    def train(state: er.elastic.TorchState) -> None:
        emit("synced", rank=er.rank(), size=er.size(), step=state.step,
             round=runtime.current().round)
        while state.step < STEPS:
            kill_once(state.step)
            optimizer.zero_grad()
            F.cross_entropy(model(data), target).backward()
            optimizer.step()
            state.step += 1
            commit_s = 0.0
            if COMMIT_EVERY and state.step % COMMIT_EVERY == 0:
                started = time.perf_counter()
                state.commit()
                commit_s = time.perf_counter() - started
            emit("step", rank=er.rank(), step=state.step, round=runtime.current().round,
                 commit_s=commit_s)

    train(state)
    emit("done", rank=er.rank(), params=parameter_count(model))
    er.shutdown()


if __name__ == "__main__":
    main()
