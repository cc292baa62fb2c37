"""The failure that torchft_train.py and er_ft_train.py inject, the same way in both.

Env: BENCH_FAILURE ("kill": SIGKILL, "stop": SIGSTOP, a hang), BENCH_FAIL_STEP and
BENCH_FAIL_RANK (that rank fails at that step, in the middle of it: after the forward
pass, before the gradients' allreduce).
"""

from __future__ import annotations

import os
import signal

from model import emit

FAILURE = os.environ.get("BENCH_FAILURE", "kill")
FAIL_STEP = int(os.environ.get("BENCH_FAIL_STEP", "-1"))
FAIL_RANK = int(os.environ.get("BENCH_FAIL_RANK", "-1"))
SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


def fail(rank: int, step: int) -> None:
    """Emits the failure's event (its time is the failure's time) and delivers it to this
    process; a stopped process stays stopped until the benchmark kills it."""
    emit(FAILURE, rank=rank, step=step)
    os.kill(os.getpid(), SIGNALS[FAILURE])
