"""The elastic training script of the benchmarks (elasticrun's API, as a user writes it).

Env (besides model.py's): BENCH_COMMIT_EVERY (0: never). The kill happens only in the
job's first round.
Events: "started" (first line, before torch is imported), "imported" (model and optimizer
built too), "joined" (first round's group built; with the join's timings), "kill" (with the
process's resident anonymous memory), "failure"
(a collective raised), "reset" (new round's group built; with the join's timings),
"synced" (state synced, step restored), "step" (with the commit's duration),
"done" (parameter count).
"""

from __future__ import annotations

import time

STARTED = time.time()

import os  # noqa: E402
import signal  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from model import (  # noqa: E402
    KILL_RANK,
    KILL_STEP,
    STEPS,
    STEPS_AT_TARGET,
    TARGET_SIZE,
    StepProfile,
    batch,
    build_model,
    emit,
    parameter_count,
)

import elasticrun.torch as er  # noqa: E402
from elasticrun.torch.world import runtime  # noqa: E402

COMMIT_EVERY = int(os.environ.get("BENCH_COMMIT_EVERY", "1"))


def anonymous_mb() -> int:
    """This process's resident anonymous memory, MiB (what the kernel frees at a kill)."""
    with open("/proc/self/status") as status:
        line = next((line for line in status if line.startswith("RssAnon:")), "RssAnon: 0 kB")
    return int(line.split()[1]) // 1024


def emit_join(event: str, **fields: object) -> None:
    timing = runtime.current().last_join
    emit(event, rank=er.rank(), size=er.size(), round=runtime.current().round,
         asked=timing.asked, assigned=timing.assigned, built=timing.built, **fields)


def main() -> None:
    emit("started", at=STARTED)
    # Everything slow before joining: from its join until its state is synced, a worker
    # joining a running job holds up the others (torch's first optimizer alone takes ~1 s).
    model = build_model()
    optimizer = er.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                        named_parameters=model.named_parameters())
    state = er.elastic.TorchState(model, optimizer, step=0)
    emit("imported")
    er.init()
    emit_join("joined")
    state.register_reset_callbacks([lambda: emit_join("reset")])
    data, target = batch(er.rank())
    at_target = 0
    profile = StepProfile(er.rank())

    @er.elastic.run
    def train(state: er.elastic.TorchState) -> None:
        nonlocal at_target
        emit("synced", rank=er.rank(), size=er.size(), step=state.step)
        at_target = 0
        while state.step < STEPS and not (TARGET_SIZE and at_target >= STEPS_AT_TARGET):
            if state.step == KILL_STEP and er.rank() == KILL_RANK \
                    and runtime.current().round == 1:
                emit("kill", rank=er.rank(), step=state.step, anon_mb=anonymous_mb())
                os.kill(os.getpid(), signal.SIGKILL)
            profile.at(state.step)
            commit_s = 0.0
            try:
                optimizer.zero_grad()
                F.cross_entropy(model(data), target).backward()
                optimizer.step()
                state.step += 1
                if COMMIT_EVERY and state.step % COMMIT_EVERY == 0:
                    started = time.perf_counter()
                    state.commit()
                    commit_s = time.perf_counter() - started
            except er.elastic.HostsUpdatedInterrupt:
                raise
            except Exception:
                emit("failure", rank=er.rank())
                raise
            at_target += er.size() == TARGET_SIZE
            emit("step", rank=er.rank(), size=er.size(), step=state.step, commit_s=commit_s)

    train(state)
    emit("done", rank=er.rank(), params=parameter_count(model))
    er.shutdown()


if __name__ == "__main__":
    main()
