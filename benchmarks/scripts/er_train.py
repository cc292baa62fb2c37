"""The elastic training script of the benchmarks (elasticrun's API, as a user writes it).

Env (besides model.py's and kit.py's): BENCH_COMMIT_EVERY (0: never). The kill happens only
in the job's first round.
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
# ruff: noqa: E402  (the imports come after STARTED: a benchmark times them)

import kit
from kit import emit
from model import STEPS, STEPS_AT_TARGET, TARGET_SIZE, StepProfile, batch, elastic_setup, train_step

import elasticrun.torch as er
from elasticrun.torch.world import runtime

COMMIT_EVERY = kit.env_int("BENCH_COMMIT_EVERY", 1)


def main() -> None:
    emit("started", at=STARTED)
    # Everything slow before joining: from its join until its state is synced, a worker
    # joining a running job holds up the others (torch's first optimizer alone takes ~1 s).
    model, optimizer, state = elastic_setup(er.elastic.TorchState)
    emit("imported")
    er.init()
    kit.emit_join("joined")
    state.register_reset_callbacks([lambda: kit.emit_join("reset")])
    data, target = batch(er.rank())
    at_target = 0
    profile = StepProfile(er.rank())

    @er.elastic.run
    def train(state: er.elastic.TorchState) -> None:
        nonlocal at_target
        emit("synced", rank=er.rank(), size=er.size(), step=state.step)
        at_target = 0
        while state.step < STEPS and not (TARGET_SIZE and at_target >= STEPS_AT_TARGET):
            if state.step == kit.KILL_STEP and er.rank() == kit.KILL_RANK \
                    and runtime.current().round == 1:
                kit.signal_self("kill", rank=er.rank(), step=state.step,
                                anon_mb=kit.anonymous_mb())
            profile.at(state.step)
            commit_s = 0.0
            try:
                train_step(model, optimizer, data, target)
                state.step += 1
                if kit.due(state.step, COMMIT_EVERY):
                    commit_s = kit.timed(state.commit)
            except er.elastic.HostsUpdatedInterrupt:
                raise
            except Exception:
                emit("failure", rank=er.rank())
                raise
            at_target += er.size() == TARGET_SIZE
            emit("step", rank=er.rank(), size=er.size(), step=state.step, commit_s=commit_s)

    train(state)
    emit("done", rank=er.rank(), params=kit.parameter_count(model))
    er.shutdown()


if __name__ == "__main__":
    main()
