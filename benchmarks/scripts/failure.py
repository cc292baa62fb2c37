"""The failure that torchft_train.py and er_ft_train.py inject, the same way in both.

Env: BENCH_FAILURE ("kill": SIGKILL, "stop": SIGSTOP, a hang), BENCH_FAIL_STEP and
BENCH_FAIL_RANK (that rank fails at that step, in the middle of it: after the forward
pass, before the gradients' allreduce).
"""

from __future__ import annotations

import os
import signal

from kit import env_int, signal_self

FAILURE = os.environ.get("BENCH_FAILURE", "kill")
FAIL_STEP = env_int("BENCH_FAIL_STEP", -1)
FAIL_RANK = env_int("BENCH_FAIL_RANK", -1)
SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


def fail(rank: int, step: int) -> None:
    """Emits the failure's event (its time is the failure's time) and delivers it to this
    process; a stopped process stays stopped until the benchmark kills it."""
    signal_self(FAILURE, SIGNALS[FAILURE], rank=rank, step=step)
