"""er_train.py's job (the model, DistributedOptimizer, a commit every step) with the timeline
switched off and on every BENCH_BLOCK steps, both ranks at the same step: the job runs
with --timeline-filename BENCH_TRACE, and the script calls stop_timeline() and
start_timeline(BENCH_TRACE) (the same path: the file the driver already writes).

Events: "step" (rank, step, timeline: whether it was recording).
"""

from __future__ import annotations

import kit
from kit import emit
from model import STEPS, batch, elastic_setup, train_step

import elasticrun.torch as er

BLOCK = kit.env_int("BENCH_BLOCK", 100)
TRACE = kit.env_str("BENCH_TRACE")


def main() -> None:
    model, optimizer, state = elastic_setup(er.elastic.TorchState)
    er.init()
    data, target = batch(er.rank())

    @er.elastic.run
    def train(state: er.elastic.TorchState) -> None:
        while state.step < STEPS:
            recording = state.step // BLOCK % 2 == 1  # off first: the warm-up is in it
            if state.step % BLOCK == 0:
                if recording:
                    er.start_timeline(TRACE)
                else:
                    er.stop_timeline()
            train_step(model, optimizer, data, target)
            state.step += 1
            state.commit()
            emit("step", rank=er.rank(), step=state.step, timeline=recording)

    train(state)
    er.shutdown()


if __name__ == "__main__":
    main()
