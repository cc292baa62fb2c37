"""The HSDP benchmark's elastic script: hsdp_model.py's transformer trained by elasticrun,
either elastic HSDP (BENCH_MODE=hsdp: FSDP2 on er.shard_mesh(), er.replicate, a plain AdamW)
or today's data-parallel path (BENCH_MODE=ddp: the whole model on every rank,
er.DistributedOptimizer over AdamW); a TorchState committed every BENCH_COMMIT_EVERY steps.

Env (besides hsdp_model.py's and kit.py's): BENCH_COMMIT_EVERY, BENCH_KILL_STEP /
BENCH_KILL_RANK (that rank SIGKILLs itself at the start of that step, in the first round),
BENCH_AWAIT_SIZE=N and BENCH_STEPS_AFTER (after a shrink the survivors train 2 steps, then
wait, at most 120 s, for the world to be N again: a returning group; the job ends
BENCH_STEPS_AFTER steps after that rejoin).
Events: "started", "sizes" (parameters, this rank's local model and optimizer bytes, after
the first commit), "kill", "synced" (after each state.sync(): its duration, the round,
whether it was this process's first), "step" (with commit() and save() durations, s),
"done".
"""

from __future__ import annotations

import time

STARTED = time.time()
# ruff: noqa: E402  (the imports come after STARTED: a benchmark times them)

import kit
import torch
from hsdp_model import STEPS, build_model, local_bytes, shard, train_step
from kit import emit

import elasticrun.torch as er
from elasticrun.torch.world import runtime

MODE = kit.env_str("BENCH_MODE", "hsdp")
COMMIT_EVERY = kit.env_int("BENCH_COMMIT_EVERY", 10)
AWAIT_SIZE = kit.env_int("BENCH_AWAIT_SIZE", 0)
STEPS_AFTER = kit.env_int("BENCH_STEPS_AFTER", 3)
AWAIT_S = 120.0


class TimedState(er.elastic.TorchState):
    """A TorchState whose sync() and save() (the copy a commit makes) are timed. Private
    names: a TorchState commits and syncs its public attributes."""

    _first_sync = True
    _save_s = 0.0

    def sync(self) -> None:
        sync_s = kit.timed(super().sync)
        emit("synced", rank=er.rank(), size=er.size(), round=runtime.current().round,
             step=self.step, sync_s=sync_s, first=self._first_sync)
        self._first_sync = False

    def save(self) -> None:
        self._save_s = kit.timed(super().save)


def main() -> None:
    emit("started", at=STARTED)
    er.init()
    model = build_model()
    params = kit.parameter_count(model)
    optimizer: torch.optim.Optimizer
    if MODE == "hsdp":
        shard(model, er.shard_mesh())
        er.replicate(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    else:
        optimizer = er.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3),
                                            named_parameters=model.named_parameters())
    state = TimedState(model, optimizer, step=0)
    full = er.size()
    end = {"step": STEPS}  # moved when a returning group is awaited

    def wait_for_return() -> None:
        deadline = time.monotonic() + AWAIT_S
        while er.size() < AWAIT_SIZE:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the world did not grow back to {AWAIT_SIZE} ranks")
            time.sleep(0.2)
            state.check_host_updates()

    @er.elastic.run
    def train(state: TimedState) -> None:
        shrunk_at = state.step if er.size() < full else None
        if AWAIT_SIZE and er.size() >= AWAIT_SIZE and runtime.current().round > 1:
            end["step"] = state.step + STEPS_AFTER  # the group came back
        while state.step < end["step"]:
            if AWAIT_SIZE and shrunk_at is not None and state.step >= shrunk_at + 2:
                wait_for_return()
            if state.step == kit.KILL_STEP and er.rank() == kit.KILL_RANK \
                    and runtime.current().round == 1:
                kit.signal_self("kill", rank=er.rank(), step=state.step)
            train_step(model, optimizer, er.rank(), state.step)
            state.step += 1
            commit_s = save_s = 0.0
            if kit.due(state.step, COMMIT_EVERY):
                commit_s, save_s = kit.timed(state.commit), state._save_s
                if state.step == COMMIT_EVERY and runtime.current().round == 1:
                    emit("sizes", rank=er.rank(), params=params,
                         model_bytes=local_bytes(model.state_dict()),
                         optimizer_bytes=local_bytes(optimizer.state_dict()["state"]))
            emit("step", rank=er.rank(), size=er.size(), round=runtime.current().round,
                 step=state.step, commit_s=commit_s, save_s=save_s)

    train(state)
    emit("done", rank=er.rank(), size=er.size(), params=params)
    er.shutdown()


if __name__ == "__main__":
    main()
