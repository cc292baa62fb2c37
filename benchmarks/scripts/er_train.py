"""Training loop for the benchmarks: an MLP of a chosen size, timestamped events.

Env: BENCH_PARAMS (approximate parameter count), BENCH_STEPS, BENCH_COMMIT_EVERY (0: never;
-1: every other step, to compare steps with and without a commit within one run),
BENCH_KILL_STEP / BENCH_KILL_RANK (SIGKILL self at that step), BENCH_OUT (JSON lines file).
Events: "kill" (just before the SIGKILL), "failure" (a survivor's collective raised),
"reset" (reset callback: new round joined, group built), "synced" (state synced, training
about to resume), "step" (a completed step), "done" (with the mean step time).
"""

from __future__ import annotations

import json
import math
import os
import signal
import time

import torch
import torch.nn.functional as F

import elasticrun.torch as er

PARAMS = int(float(os.environ.get("BENCH_PARAMS", "1e6")))
STEPS = int(os.environ.get("BENCH_STEPS", "60"))
COMMIT_EVERY = int(os.environ.get("BENCH_COMMIT_EVERY", "1"))
KILL_STEP = int(os.environ.get("BENCH_KILL_STEP", "-1"))
KILL_RANK = int(os.environ.get("BENCH_KILL_RANK", "-1"))
OUT = os.environ.get("BENCH_OUT", "/dev/null")
BATCH = 32


def emit(event: str, **fields: object) -> None:
    with open(OUT, "a") as file:
        file.write(json.dumps({"event": event, "time": time.time(), "pid": os.getpid(),
                               **fields}) + "\n")


def build_model() -> torch.nn.Module:
    # One w*w layer dominates: w*w + w*(64 + 10) parameters.
    width = max(8, int(math.sqrt(PARAMS)))
    return torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, 10))


def main() -> None:
    er.init()
    torch.manual_seed(0)
    model = build_model()
    optimizer = er.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                        named_parameters=model.named_parameters())
    state = er.elastic.TorchState(model, optimizer, step=0)
    state.register_reset_callbacks([lambda: emit("reset", rank=er.rank(), size=er.size())])
    data = torch.randn(BATCH, 64)
    target = torch.randint(0, 10, (BATCH,))
    durations: list[float] = []
    with_commit: list[float] = []

    @er.elastic.run
    def train(state: er.elastic.TorchState) -> None:
        emit("synced", rank=er.rank(), size=er.size(), step=state.step)
        while state.step < STEPS:
            if state.step == KILL_STEP and er.rank() == KILL_RANK:
                emit("kill", rank=er.rank(), step=state.step)
                os.kill(os.getpid(), signal.SIGKILL)
            started = time.perf_counter()
            try:
                optimizer.zero_grad()
                F.cross_entropy(model(data), target).backward()
                optimizer.step()
                state.step += 1
                every = 2 if COMMIT_EVERY == -1 else COMMIT_EVERY
                committed = bool(every) and state.step % every == 0
                if committed:
                    state.commit()
            except Exception:
                emit("failure", rank=er.rank())
                raise
            (with_commit if committed and COMMIT_EVERY == -1 else durations).append(
                time.perf_counter() - started)
            emit("step", rank=er.rank(), size=er.size(), step=state.step)

    train(state)
    def median(values: list[float]) -> float:
        steady = sorted(values[3:]) or sorted(values) or [0.0]
        return steady[len(steady) // 2]

    emit("done", rank=er.rank(), median_step_s=median(durations),
         median_commit_step_s=median(with_commit),
         params=sum(p.numel() for p in model.parameters()))
    er.shutdown()


if __name__ == "__main__":
    main()
