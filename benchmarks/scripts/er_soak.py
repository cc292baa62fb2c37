"""The training script of the recovery-distribution soak (recovery_dist.py): er_train.py's
model and loop, committing every step, until told to stop. The benchmark SIGKILLs or
SIGSTOPs one of its processes at any moment, many times over.

Env (besides model.py's BENCH_PARAMS, BENCH_DEVICE_S and kit.py's BENCH_OUT): BENCH_STOP_FILE
(when it exists at a check, every STOP_EVERY steps, every rank stops there: rank 0 looks, and
tells the others).
Events, each with the worker's host (ELASTICRUN_HOSTNAME) and, once it has one, its rank,
world size and round: "started", "joined" (its first round's group built; with the join's
timings and the parameter count), "reset" (a later round's group built; the same timings),
"synced" (state synced, step restored), "step", "failure" (a collective raised), "done".
"""

from __future__ import annotations

import time

STARTED = time.time()
# ruff: noqa: E402  (the imports come after STARTED: a benchmark times them)

import kit
from kit import emit
from model import batch, device_time, elastic_setup, train_step

import elasticrun.torch as er
from elasticrun.torch.world import runtime

STOP_FILE = kit.env_path("BENCH_STOP_FILE")
STOP_EVERY = 10  # steps between stop checks: a broadcast, kept out of most steps


class SoakState(er.elastic.TorchState):
    step: int  # one of its kwargs: restored with the rest at a rollback


def main() -> None:
    emit("started", at=STARTED)
    # Everything slow before joining: a worker joining a running job holds up the others
    # from its join until its state is synced.
    model, optimizer, state = elastic_setup(SoakState)
    er.init()
    kit.emit_join("joined", params=kit.parameter_count(model))
    state.register_reset_callbacks([lambda: kit.emit_join("reset")])

    @er.elastic.run
    def train(state: SoakState) -> None:
        data, target = batch(er.rank())
        emit("synced", rank=er.rank(), size=er.size(), round=runtime.current().round,
             step=state.step)
        while True:
            try:
                device_time()
                train_step(model, optimizer, data, target)
                state.step += 1
                state.commit()
                stop = state.step % STOP_EVERY == 0 and \
                    er.broadcast_object(STOP_FILE.exists(), root_rank=0)
            except er.elastic.HostsUpdatedInterrupt:
                raise
            except Exception:
                emit("failure", rank=er.rank(), round=runtime.current().round)
                raise
            emit("step", rank=er.rank(), size=er.size(), round=runtime.current().round,
                 step=state.step)
            if stop:
                return

    train(state)
    emit("done", rank=er.rank())
    er.shutdown()


if __name__ == "__main__":
    main()
