"""Pure: what a worker's exit code means, in words and as a metric label."""

from __future__ import annotations

import signal


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


# Deaths no stop of elasticrun's causes before its grace period ends, and no peer's failure
# causes either: a kill from outside (the OOM killer, `kill -9`) or a crash.
_OUTSIDE = frozenset({signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL,
                      signal.SIGFPE})


def killed_from_outside(code: int) -> bool:
    """Whether an exit code (local: -N; from an SSH host or agent: 128+N) is such a death."""
    number = -code if code < 0 else code - 128 if 128 < code < 160 else 0
    return number in _OUTSIDE


def exit_kind(exit_code: int | None) -> str:
    """The `cause` label of a worker failure: killed by a signal, or a non-zero exit."""
    if exit_code is None:
        return "unknown"
    if exit_code < 0 or 128 < exit_code < 160:  # local signal, or 128+N from an SSH host
        return "signal"
    return "exit_code"
