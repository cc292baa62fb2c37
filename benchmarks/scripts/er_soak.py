"""The training script of the recovery-distribution soak (recovery_dist.py): er_train.py's
model and loop, committing every step, until told to stop. The benchmark SIGKILLs or
SIGSTOPs one of its processes at any moment, many times over.

Env (besides model.py's BENCH_PARAMS, BENCH_OUT and BENCH_DEVICE_S): BENCH_STOP_FILE (when
it exists at a check, every STOP_EVERY steps, every rank stops there: rank 0 looks, and
tells the others).
Events, each with the worker's host (ELASTICRUN_HOSTNAME) and, once it has one, its rank,
world size and round: "started", "joined" (its first round's group built; with the join's
timings and the parameter count), "reset" (a later round's group built; the same timings),
"synced" (state synced, step restored), "step", "failure" (a collective raised), "done".
"""

from __future__ import annotations

import time

STARTED = time.time()

import os  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from model import batch, build_model, device_time, emit, parameter_count  # noqa: E402

import elasticrun.torch as er  # noqa: E402
from elasticrun.torch.world import runtime  # noqa: E402

STOP_FILE = os.environ["BENCH_STOP_FILE"]
STOP_EVERY = 10  # steps between stop checks: a broadcast, kept out of most steps
HOST = os.environ.get("ELASTICRUN_HOSTNAME", "")


def note(event: str, **fields: object) -> None:
    emit(event, host=HOST, **fields)


def note_join(event: str, **fields: object) -> None:
    timing = runtime.current().last_join
    note(event, rank=er.rank(), size=er.size(), round=runtime.current().round,
         asked=timing.asked, assigned=timing.assigned, built=timing.built, **fields)


class SoakState(er.elastic.TorchState):
    step: int  # one of its kwargs: restored with the rest at a rollback


def main() -> None:
    note("started", at=STARTED)
    # Everything slow before joining: a worker joining a running job holds up the others
    # from its join until its state is synced.
    model = build_model()
    optimizer = er.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                        named_parameters=model.named_parameters())
    state = SoakState(model, optimizer, step=0)
    er.init()
    note_join("joined", params=parameter_count(model))
    state.register_reset_callbacks([lambda: note_join("reset")])

    @er.elastic.run
    def train(state: SoakState) -> None:
        data, target = batch(er.rank())
        note("synced", rank=er.rank(), size=er.size(), round=runtime.current().round,
             step=state.step)
        while True:
            try:
                device_time()
                optimizer.zero_grad()
                F.cross_entropy(model(data), target).backward()
                optimizer.step()
                state.step += 1
                state.commit()
                stop = state.step % STOP_EVERY == 0 and \
                    er.broadcast_object(os.path.exists(STOP_FILE), root_rank=0)
            except er.elastic.HostsUpdatedInterrupt:
                raise
            except Exception:
                note("failure", rank=er.rank(), round=runtime.current().round)
                raise
            note("step", rank=er.rank(), size=er.size(), round=runtime.current().round,
                 step=state.step)
            if stop:
                return

    train(state)
    note("done", rank=er.rank())
    er.shutdown()


if __name__ == "__main__":
    main()
