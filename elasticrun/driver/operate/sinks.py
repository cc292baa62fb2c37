"""The driver's outbound job events: signed webhooks and a JSON-lines file.

Emitting never blocks the driver and never raises into it: each sink owns its
delivery, drops what it cannot deliver (counting it) and rate-limits its warnings.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol
from urllib.parse import urlsplit

log = logging.getLogger("elasticrun.events")

EVENT_TYPES = ("job_started", "driver_resumed", "round_started", "round_restarting",
               "host_added", "host_removed", "host_drained", "host_blacklisted",
               "host_restored", "slot_blacklisted", "slot_restored", "worker_failed",
               "total_loss", "state_restored", "straggler", "straggler_cleared",
               "job_finished", "job_failed")
HEADER_EVENT = "X-Elasticrun-Event"
HEADER_TIMESTAMP = "X-Elasticrun-Timestamp"
HEADER_SIGNATURE = "X-Elasticrun-Signature"
LOG_INTERVAL_S = 30.0  # after the first failure, at most one warning per sink per interval
CANCEL_GRACE_S = 0.25  # how long close() waits for a cancelled delivery task to unwind


@dataclass(frozen=True)
class Event:
    seq: int
    type: str
    time: float
    job_id: str
    data: dict[str, Any]

    def to_json(self) -> bytes:
        doc = {"seq": self.seq, "type": self.type, "time": self.time, "job_id": self.job_id,
               "data": self.data}
        # default=str: a stray non-JSON value must not make an event undeliverable.
        return json.dumps(doc, separators=(",", ":"), sort_keys=True, default=str).encode()


def sign_event(key: bytes, timestamp: str, body: bytes) -> str:
    """The signature header: "sha256=" + hex HMAC-SHA256(key, timestamp + "." + body)."""
    return "sha256=" + hmac.new(key, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def verify_event(key: bytes, headers: Mapping[str, str], body: bytes, now: float,
                 window_s: float = 300.0) -> bool:
    """For receivers: True when the event is authentic and its timestamp within window_s of now."""
    lowered = {name.lower(): value for name, value in headers.items()}  # case-insensitive
    timestamp = lowered.get(HEADER_TIMESTAMP.lower())
    given = lowered.get(HEADER_SIGNATURE.lower())
    if not timestamp or not given or not (timestamp.isascii() and given.isascii()):
        return False
    try:
        sent_at = float(timestamp)
    except ValueError:
        return False
    if not math.isfinite(sent_at) or abs(now - sent_at) > window_s:
        return False
    return hmac.compare_digest(sign_event(key, timestamp, body), given)


def redact_url(url: str) -> str:
    """scheme://host:port and the path's first segment: no userinfo, query, fragment or deeper
    path (all may hold secrets, e.g. the token at the end of a Slack webhook URL)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return "<invalid url>"
    host = f"[{host}]" if ":" in host else host
    first, _, rest = parts.path.lstrip("/").partition("/")
    path = (f"/{first}" if first or parts.path else "") + ("/..." if rest else "")
    return f"{parts.scheme}://{host}{port}{path}"


class EventSink(Protocol):
    def publish(self, event: Event) -> None: ...

    async def close(self, timeout: float) -> None: ...


class JsonLinesSink:
    """Appends one JSON line per event; after a write error, warns once and drops the rest."""

    def __init__(self, path: Path) -> None:
        self._path = Path(path)
        self._file: BinaryIO | None = None
        try:  # unbuffered: each line is one write() on an O_APPEND file, flushed at once
            self._file = open(self._path, "ab", buffering=0)  # noqa: SIM115
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        log.warning("cannot write job events to %s (%s); later events are dropped", self._path, exc)
        self._close()

    def _close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            with contextlib.suppress(OSError):
                file.close()

    def publish(self, event: Event) -> None:
        if self._file is not None:
            try:
                self._file.write(event.to_json() + b"\n")
            except (OSError, ValueError) as exc:
                self._fail(exc)

    async def close(self, timeout: float) -> None:
        self._close()


class EventBus:
    """Numbers the job's events and hands each one to every sink."""

    def __init__(self, job_id: str, sinks: Sequence[EventSink]) -> None:
        self.job_id = job_id
        self.sinks = list(sinks)
        self._seq = 0

    def emit(self, event_type: str, /, **data: Any) -> Event:
        """Positional-only type, so that data may hold any key (even "type")."""
        if event_type not in EVENT_TYPES:
            raise ValueError(f"unknown event type {event_type!r}; expected one of {EVENT_TYPES}")
        self._seq += 1
        event = Event(self._seq, event_type, time.time(), self.job_id, data)
        for sink in self.sinks:
            try:
                sink.publish(event)
            except Exception:  # a sink that breaks its promise must not break the driver
                log.exception("event sink %r failed to take event %s", sink, event_type)
        return event

    async def close(self, timeout: float = 2.0) -> None:
        """Closes every sink concurrently, all within the one timeout (plus a small grace)."""
        tasks = [asyncio.ensure_future(sink.close(timeout)) for sink in self.sinks]
        if not tasks:
            return
        done, late = await asyncio.wait(tasks, timeout=timeout + CANCEL_GRACE_S)
        for task in late:  # only a misbehaving custom sink gets here
            task.cancel()
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.warning("event sink failed to close: %r", task.exception())
