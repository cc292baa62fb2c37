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


def exit_kind(exit_code: int | None) -> str:
    """The `cause` label of a worker failure: killed by a signal, or a non-zero exit."""
    if exit_code is None:
        return "unknown"
    if exit_code < 0 or 128 < exit_code < 160:  # local signal, or 128+N from an SSH host
        return "signal"
    return "exit_code"
