"""The signed-webhook event sink: delivery in the background, retries with backoff, drops
counted, warnings rate-limited. It never blocks the driver and never raises into it."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import time

import aiohttp

from elasticrun.driver.operate.sinks import (
    CANCEL_GRACE_S,
    HEADER_EVENT,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    LOG_INTERVAL_S,
    Event,
    redact_url,
    sign_event,
)
from elasticrun.system.timed import within

log = logging.getLogger("elasticrun.events")


def _describe(exc: BaseException, timeout: float) -> str:
    # Never str(exc): some aiohttp errors embed the full URL, with its credentials.
    if isinstance(exc, asyncio.TimeoutError):
        return f"no response within {timeout:g} s"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect ({exc.os_error.strerror or type(exc.os_error).__name__})"
    return type(exc).__name__


class WebhookSink:
    """POSTs signed events to one URL, in order, from one background task with a bounded queue."""

    def __init__(self, url: str, key: bytes, *, timeout: float = 5.0, max_attempts: int = 5,
                 backoff: tuple[float, float] = (0.2, 5.0), queue_size: int = 1000) -> None:
        self._url, self._key, self._timeout = url, key, timeout
        self._max_attempts, self._backoff = max(1, max_attempts), backoff
        self._queue_size = max(1, queue_size)
        self._safe_url = redact_url(url)
        self._queue: collections.deque[Event] = collections.deque()
        self._inflight: Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._wakeup = asyncio.Event()
        self._changed = asyncio.Event()  # set after every attempt, so close() can re-check
        self._closed = self._failing = False
        self._delivered = self._dropped = self._unreported = 0
        self._last_log: float | None = None
        self._last_reason = ""

    @property
    def delivered(self) -> int:
        return self._delivered

    @property
    def dropped(self) -> int:
        return self._dropped

    @property
    def pending(self) -> int:
        return len(self._queue) + (self._inflight is not None)

    def publish(self, event: Event) -> None:
        try:
            if self._closed:
                self._drop(1, "sink closed")
                return
            if len(self._queue) >= self._queue_size:
                self._queue.popleft()
                self._drop(1, "queue full")
            self._queue.append(event)
            self._wakeup.set()
            self._ensure_task()
        except Exception:  # publish is called from the driver's hot path: never raise
            log.exception("cannot queue event for webhook %s", self._safe_url)

    def _ensure_task(self) -> None:
        with contextlib.suppress(RuntimeError):  # no running loop: the next publish starts it
            if self._task is None:
                self._task = asyncio.get_running_loop().create_task(self._run())

    def _may_log(self) -> bool:
        now = time.monotonic()
        if self._last_log is not None and now - self._last_log < LOG_INTERVAL_S:
            return False
        self._last_log = now
        return True

    def _attempt_failed(self, reason: str, transient: bool) -> None:
        # A 4xx answer comes from a live receiver: close() still waits for the queue then.
        self._failing, self._last_reason = transient, reason
        if self._last_log is None and self._may_log():  # the first failure, at once
            log.warning("event webhook %s failed: %s (dropped events are reported at most "
                        "every %g s)", self._safe_url, reason, LOG_INTERVAL_S)

    def _drop(self, count: int, reason: str) -> None:
        self._dropped, self._unreported = self._dropped + count, self._unreported + count
        if self._may_log():
            log.warning("event webhook %s: %d event(s) dropped since the last report (last: %s)",
                        self._safe_url, self._unreported, self._last_reason or reason)
            self._unreported = 0

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self._timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                while not self._queue:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                self._inflight = self._queue.popleft()
                try:
                    await self._deliver(session, self._inflight)
                except Exception:  # a bug here must not kill delivery of later events
                    log.exception("event webhook %s: delivery failed", self._safe_url)
                    self._drop(1, "internal error")
                finally:
                    self._inflight = None
                    self._changed.set()

    async def _deliver(self, session: aiohttp.ClientSession, event: Event) -> None:
        body = event.to_json()
        reason = ""
        for attempt in range(1, self._max_attempts + 1):
            timestamp = str(int(time.time()))
            headers = {"Content-Type": "application/json", HEADER_EVENT: event.type,
                       HEADER_TIMESTAMP: timestamp,
                       HEADER_SIGNATURE: sign_event(self._key, timestamp, body)}
            try:
                async with session.post(self._url, data=body, headers=headers,
                                        allow_redirects=False) as response:
                    status = response.status
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
                reason, retry = _describe(exc, self._timeout), True
            else:
                if 200 <= status < 300:
                    self._delivered, self._failing = self._delivered + 1, False
                    return
                reason, retry = f"HTTP {status}", status == 429 or status >= 500
            self._attempt_failed(reason, transient=retry)
            self._changed.set()
            if not retry or attempt == self._max_attempts:
                break
            low, high = self._backoff
            cap = min(high, low * 2 ** (attempt - 1))
            await asyncio.sleep(random.uniform(max(low, cap / 2), max(low, cap)))
        self._drop(1, reason)

    async def close(self, timeout: float) -> None:
        """Waits up to timeout for the queue to drain, unless delivery is failing; then stops."""
        if self._closed:
            return
        self._closed = True
        if self._queue:  # every publish may have come before the loop ran
            self._ensure_task()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while self.pending and not self._failing and self._task and not self._task.done():
                self._changed.clear()
                await within(self._changed.wait(), max(0.0, deadline - loop.time()))
        except TimeoutError:
            pass
        finally:  # even when close() itself is cancelled, delivery stops and is accounted for
            lost, self._inflight = self.pending, None
            self._queue.clear()
            self._dropped += lost
            if self._task is not None:
                self._task.cancel()  # also closes the session, on the task's way out
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=CANCEL_GRACE_S)
            if self._task.done() and not self._task.cancelled():
                self._task.exception()  # retrieved, so it is not reported as lost
        if self._dropped:
            log.warning("event webhook %s: %d event(s) not delivered (%d still queued at close)",
                        self._safe_url, self._dropped, lost)
