"""The job's trace file: Chrome's Trace Event Format, in its JSON array form.

`[` when the file is opened, each batch of events on a line as they come, `]` when it is
closed, so that the file is valid JSON once the job ends; a file whose driver was killed
lacks only the `]`, which Perfetto and chrome://tracing accept. Times are microseconds
since the epoch. The functions below build events; `from_worker` checks what a worker sent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

TEXT_LIMIT = 200
MAX_TID = 10_000
WORKER_METADATA = ("thread_name", "thread_sort_index")

Event = dict[str, Any]
# One encoder, one call per batch: json.dumps with options builds an encoder per call.
_ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


class TraceFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("w", encoding="utf-8")  # OSError: the caller says why
        self._file.write("[\n")
        self._file.flush()
        self._written = 0

    @property
    def written(self) -> int:
        return self._written

    @property
    def closed(self) -> bool:
        return self._file.closed

    def write(self, events: Iterable[Event]) -> None:
        batch = list(events)
        if not batch or self._file.closed:
            return
        text = _ENCODE(batch)[1:-1]  # the events without the list's brackets
        self._file.write((",\n" if self._written else "") + text)
        self._file.flush()  # a killed driver leaves every event it took
        self._written += len(batch)

    def close(self) -> None:
        if not self._file.closed:
            self._file.write("\n]\n")
            self._file.close()


def metadata(pid: int, name: str, args: dict[str, Any], tid: int = 0) -> Event:
    """`process_name`, `process_sort_index`, `thread_name`, `thread_sort_index`."""
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def complete(pid: int, tid: int, name: str, category: str, start: float, end: float,
             args: dict[str, Any]) -> Event:
    """An "X" event from `start` to `end` (seconds since the epoch)."""
    return {"name": name, "cat": category, "ph": "X", "ts": _us(start),
            "dur": _us(max(0.0, end - start)), "pid": pid, "tid": tid, "args": args}


def instant(pid: int, tid: int, name: str, category: str, at: float, args: dict[str, Any],
            scope: str = "t") -> Event:
    """An "i" event; scope "t" (its thread), "p" (its process) or "g" (every lane)."""
    return {"name": name, "cat": category, "ph": "i", "s": scope, "ts": _us(at), "pid": pid,
            "tid": tid, "args": args}


def from_worker(raw: Any, pid: int) -> Event:
    """A worker's event, `[phase, name, category, ts_us, dur_us, tid, args]`, as a trace
    event of lane `pid`. ValueError (one line) if it is not well formed."""
    if not isinstance(raw, list) or len(raw) != 7:
        raise ValueError("an event must be [phase, name, category, ts, dur, tid, args]")
    phase, name, category, ts, dur, tid, args = raw
    if phase not in ("X", "i", "M"):
        raise ValueError(f"event phase {str(phase)[:20]!r}: expected X, i or M")
    if not isinstance(name, str) or not isinstance(category, str):
        raise ValueError("an event's name and category must be strings")
    if not (_finite(ts) and _finite(dur)) or dur < 0:
        raise ValueError("an event's ts and dur must be finite numbers, dur >= 0")
    if isinstance(tid, bool) or not isinstance(tid, int) or not 0 <= tid < MAX_TID:
        raise ValueError(f"an event's tid must be an integer 0..{MAX_TID - 1}")
    if not isinstance(args, dict):
        raise ValueError("an event's args must be an object")
    if phase == "M":
        if name not in WORKER_METADATA:
            raise ValueError(f"metadata {name[:40]!r}: a worker may only name its threads")
        return metadata(pid, name, args, tid)
    name, category = name[:TEXT_LIMIT], category[:TEXT_LIMIT]
    if phase == "X":
        return {"name": name, "cat": category, "ph": "X", "ts": ts, "dur": dur, "pid": pid,
                "tid": tid, "args": args}
    return {"name": name, "cat": category, "ph": "i", "s": "t", "ts": ts, "pid": pid,
            "tid": tid, "args": args}


def _finite(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) \
        and math.isfinite(value)


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 1)
