"""The driver's side of the journal: the machine's state written after it changed.

The driver marks the journal after every event it handled; the writer encodes the state on
the event loop (the only place it is consistent) and hands the file work (write, fsync,
rename) to a thread. Writes never pile up: one at a time, the newest state winning, and at
most one every `min_interval` seconds while marks keep coming (a round of thousands of
joins is one write, not thousands); `flush()` writes what is pending now (at a clean end, and
before a resumed driver serves anything).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from elasticrun.driver.journal.fencing import HEARTBEAT_S
from elasticrun.driver.journal.files import JournalFiles

log = logging.getLogger("elasticrun.journal")

MIN_INTERVAL_S = 0.05


class JournalWriter:
    def __init__(self, files: JournalFiles, body: Callable[[], dict[str, Any]],
                 min_interval: float = MIN_INTERVAL_S) -> None:
        self._files = files
        self._body = body  # the snapshot body now (codec.encode, with the journal's header)
        self._min_interval = min_interval
        self._dirty = False
        self._task: asyncio.Task[None] | None = None
        self._last_write = float("-inf")
        self._loop = asyncio.get_running_loop()  # made on the driver's loop
        self.writes = 0

    def mark(self) -> None:
        """The state changed: it will be written (soon, coalesced with later changes)."""
        self._dirty = True
        if self._task is None or self._task.done():
            self._task = self._loop.create_task(self._drain())

    async def flush(self) -> None:
        """Returns once the state as it is now is on disk."""
        self._dirty = True
        self._last_write = float("-inf")  # no pacing for this one
        if self._task is not None and not self._task.done():
            await self._task
        if self._dirty:
            await self._drain()

    async def heartbeat(self, interval: float = HEARTBEAT_S) -> None:
        """Rewrites the journal every `interval` seconds, changed or not: the time it was
        written tells a resumed driver whether this one still lives (fencing.py). Runs until
        cancelled."""
        while True:
            await asyncio.sleep(interval)
            self.mark()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _drain(self) -> None:
        while self._dirty:
            wait = self._last_write + self._min_interval - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._dirty = False
            body = self._body()  # on the loop: the state is not changing under it
            self._last_write = time.monotonic()
            try:
                await asyncio.to_thread(self._files.write, body)
            except OSError as exc:  # a full or lost disk must not stop the job
                log.warning("could not write the journal in %s: %s", self._files.directory, exc)
            self.writes += 1
