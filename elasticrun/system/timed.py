"""`within(awaitable, seconds)`: asyncio.wait_for without its lost cancellations.

On Python 3.10 and 3.11, `asyncio.wait_for` returns the awaited result, and drops the
cancellation, when the caller is cancelled at the moment the awaited thing finishes
(CPython gh-86296, fixed by the rewrite in 3.12). A loop built on it — the discovery
watcher polls a script through wait_for every interval — then runs on after being told
to stop, and whoever waits for it (the driver's shutdown) waits forever: a job that has
finished, but whose launcher does not exit. `within` never swallows a cancellation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float) -> T:
    """The result of `awaitable`, or asyncio.TimeoutError after `seconds` (the awaitable
    is then cancelled, and waited for). A cancellation of the caller always propagates,
    and cancels the awaitable too."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=max(0.0, seconds))
    except asyncio.CancelledError:
        await _stop(task)
        raise
    if not done:
        await _stop(task)
        raise TimeoutError
    return task.result()


async def _stop(task: asyncio.Future[T]) -> None:
    """Cancels `task` and lets it finish (it may clean up), as wait_for does. A second
    cancellation of the caller meanwhile propagates; the task still gets its cancel."""
    task.cancel()
    await asyncio.wait({task})
