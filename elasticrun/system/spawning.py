"""Child processes in sessions of their own, which a cancellation never leaves behind.

asyncio's `create_subprocess_exec`, cancelled while it connects the child's pipes (the child
already runs), kills the child alone and then waits for its pipes to close: a grandchild
holding them (a discovery script's `sleep`) keeps that wait, and the child's work, going on
after the driver has moved on, and the loop may close with the child's transport open
("Event loop is closed"). Seen under load: a discovery script outlived its failed job. Here
a cancelled start is let finish, and then its whole session is taken down and reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from elasticrun.system.timed import within

# How long a start that was cancelled gets to finish, and a killed child to be gone.
SETTLE_S = 5.0

_PR_SET_PDEATHSIG = 1


def _parent_death_signal() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in the child
    except (OSError, AttributeError):
        return None


_prctl = _parent_death_signal()


def die_with_parent(death_signal: int) -> Callable[[], None]:
    parent = os.getpid()

    def set_signal() -> None:
        """Runs in the child between fork and exec: only calls into libc, no imports. A
        parent killed before the signal was set never sends it (seen under load: a driver
        SIGKILLed just after forking left a worker behind), so the child then goes at once."""
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, death_signal)
            if os.getppid() != parent:
                os._exit(128 + death_signal)
    return set_signal


async def spawn_session(argv: Sequence[str], **options: Any) -> asyncio.subprocess.Process:
    """`create_subprocess_exec(*argv, start_new_session=True, **options)`. Cancelled, it
    takes the child's session down (if it started) before the cancellation goes on."""
    start = asyncio.ensure_future(
        asyncio.create_subprocess_exec(*argv, start_new_session=True, **options))
    try:
        return await asyncio.shield(start)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):  # an error to start is no one's news now
            await kill_session(await within(asyncio.shield(start), SETTLE_S))
        raise


async def kill_session(proc: asyncio.subprocess.Process) -> None:
    """SIGKILLs `proc`'s session (its process group) and waits, bounded, until `proc` is
    reaped and its pipes closed. A second cancellation meanwhile does not stop the wait."""
    signal_session(proc.pid, signal.SIGKILL)
    with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
        await within(asyncio.shield(proc.wait()), SETTLE_S)


def signal_session(pid: int, sig: int) -> None:
    """Sends `sig` to the process group that `pid` leads (gone already: nothing to do)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def stop_session(pid: int, exited: Awaitable[object], grace_period: float) -> None:
    """SIGTERM to the session `pid` leads, SIGKILL after `grace_period`, then a bounded wait
    for `exited` (the leader's exit, shielded: its waiters are not cancelled)."""
    ended = asyncio.ensure_future(exited)
    if not ended.done():
        signal_session(pid, signal.SIGTERM)
        with contextlib.suppress(asyncio.TimeoutError):
            await within(asyncio.shield(ended), grace_period)
    signal_session(pid, signal.SIGKILL)
    if not ended.done():
        with contextlib.suppress(asyncio.TimeoutError):
            await within(asyncio.shield(ended), SETTLE_S)
