"""The Timeline, worker side: what this process did, as trace events for the driver's file.

Off (the default), every call here is one flag check and nothing is kept. On (the
`--timeline-filename` flag, Horovod's `HOROVOD_TIMELINE`, or `start_timeline(path)` in the
script), events are appended to an in-memory queue and a daemon thread sends them to the
driver in batches every SEND_INTERVAL_S; the driver writes the job's one trace file, with a
lane per worker process. Times are wall clock (`time.time()`), so that the lanes of all
hosts share one axis (the hosts' clocks must be synchronised, e.g. by NTP).

Categories: "collective" (one event per launch or wait of a collective), "fusion" (one per
fused bucket, launch to completion), "elastic" (commit, restore, sync, reset, interrupts,
failures) and "round" (joining a round, building and leaving its group).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from elasticrun import protocol
from elasticrun.worker.client import DriverClient, DriverUnreachableError, RequestRefusedError
from elasticrun.worker.timeline_tracks import Tracks

log = logging.getLogger("elasticrun.timeline")

SEND_INTERVAL_S = 0.5
FLUSH_TIMEOUT_S = 2.0  # the last batch at shutdown: never holds the exit longer
MAX_BATCH = 4000  # events per request (well below the server's body limit)
MAX_PENDING = 200_000  # kept while the driver does not take them; the oldest go first
TEXT_LIMIT = 200

# The threads (`tid`) of a worker's lane, by category; events that overlap there without
# nesting (collectives in flight at once) go to the category's next thread: tid + 10 * k.
ELASTIC_TID, COLLECTIVE_TID, OTHER_TID, FUSION_TID = 1, 2, 3, 4
_TIDS = {"elastic": ELASTIC_TID, "round": ELASTIC_TID, "collective": COLLECTIVE_TID,
         "fusion": FUSION_TID}
_THREADS = {ELASTIC_TID: "elastic and rounds", COLLECTIVE_TID: "collectives",
            OTHER_TID: "other", FUSION_TID: "fusion"}

# (phase, name, category, start, duration, args); times in seconds since the epoch.
Event = tuple[str, str, str, float, float, dict[str, Any]]
# (rank, host) of this worker now; rank -1 before its first round.
Lane = Callable[[], tuple[int, str]]

_on = False
_mark_cycles = False
_events: deque[Event] = deque()  # appends and pops are atomic: no lock on the hot path
_recorder: _Recorder | None = None


def enabled() -> bool:
    return _on


def record(name: str, category: str, start: float, end: float, **args: Any) -> None:
    """A complete event from `start` to `end` (both from time.time())."""
    if _on:
        _events.append(("X", name, category, start, end - start, args))


def instant(name: str, category: str, **args: Any) -> None:
    if _on:
        _events.append(("i", name, category, time.time(), 0.0, args))


def mark_cycle() -> None:
    """An instant "CYCLE" event, when the timeline marks cycles (one per optimizer step)."""
    if _on and _mark_cycles:
        _events.append(("i", "CYCLE", "collective", time.time(), 0.0, {}))


class span:  # noqa: N801 - used like a function: `with timeline.span("commit", "elastic"):`
    """Records a complete event around the block (with the exception's type, if one ends
    it); costs one flag check when the timeline is off."""

    __slots__ = ("_name", "_category", "_args", "_start")

    def __init__(self, name: str, category: str, **args: Any) -> None:
        self._name = name
        self._category = category
        self._args = args
        self._start = 0.0

    def __enter__(self) -> span:
        if _on:
            self._start = time.time()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if _on and self._start:
            if kind is not None:
                self._args["error"] = kind.__name__
            _events.append(("X", self._name, self._category, self._start,
                            time.time() - self._start, self._args))


# --- starting and stopping ----------------------------------------------------------------
def start(path: str | None = None, mark_cycles: bool = False) -> None:
    """Starts recording. With `path`, first asks the driver to write the job's trace there
    (the same path again is fine; another one while it writes one is a ValueError)."""
    global _on, _mark_cycles
    recorder = _recorder
    if recorder is None:
        raise ValueError("elasticrun is not initialised: call init() before starting the "
                         "timeline")
    if recorder.client is None:
        log.warning("not started by elasticrun: there is no driver to write the timeline, "
                    "so nothing is recorded")
        return
    if path is not None:
        recorder.open(os.path.abspath(path))
    _mark_cycles = mark_cycles
    _on = True
    recorder.begin()


def stop() -> None:
    """Stops recording in this process; what it recorded is still sent."""
    global _on
    _on = False
    if _recorder is not None:
        _recorder.wake()


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Horovod's `hvd.start_timeline`: this worker records into the job's trace at
    `file_path` (written by the driver, on its host)."""
    start(file_path, mark_cycles)


def stop_timeline() -> None:
    """Horovod's `hvd.stop_timeline`: this worker stops recording."""
    stop()


def settings_from_env(env: Mapping[str, str]) -> tuple[bool, str | None, bool]:
    """(record from init() on, the path to ask the driver for, mark cycles): elasticrun's
    flag, else Horovod's HOROVOD_TIMELINE (a path; "DYNAMIC" only allows start_timeline)."""
    if env.get(protocol.ENV_TIMELINE) == "1":
        return True, None, env.get(protocol.ENV_TIMELINE_MARK_CYCLES) == "1"
    path = env.get("HOROVOD_TIMELINE", "").strip()
    if path and path != "DYNAMIC":
        marks = env.get("HOROVOD_TIMELINE_MARK_CYCLES", "").strip().lower()
        return True, path, marks in ("1", "true", "yes", "on")
    return False, None, False


def attach(client: DriverClient | None, worker_id: str, lane: Lane,
           env: Mapping[str, str] = os.environ) -> None:
    """Called by init(): where events go (None: no driver), then recording starts if the
    environment asks for it. A refused start is a warning, not the end of the training."""
    global _recorder
    _recorder = _Recorder(client, worker_id, lane)
    on, path, mark_cycles = settings_from_env(env)
    if on and client is not None:
        try:
            start(path, mark_cycles)
        except ValueError as exc:
            log.warning("the timeline was not started: %s", exc)


def detach(timeout: float = FLUSH_TIMEOUT_S) -> None:
    """Called by shutdown(): stops recording and sends what is left, waiting at most
    `timeout` seconds."""
    global _recorder, _on
    _on = False
    recorder, _recorder = _recorder, None
    if recorder is not None:
        recorder.close(timeout)


# --- the sender -----------------------------------------------------------------------------
class _Recorder:
    def __init__(self, client: DriverClient | None, worker_id: str, lane: Lane) -> None:
        self.client = client
        self._worker_id = worker_id
        self._lane = lane
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._closing = False
        self._named: set[int] = set()  # threads of this lane already named
        self._tracks = Tracks()
        self._dropped = 0
        self._known: tuple[int, str] = (-1, "")  # the last lane with a rank

    def open(self, path: str) -> None:
        assert self.client is not None
        try:
            self.client.call(protocol.PATH_TIMELINE, {"worker_id": self._worker_id,
                                                      "open": path, "events": []})
        except RequestRefusedError as exc:
            raise ValueError(f"timeline {path}: {exc}") from None
        except DriverUnreachableError as exc:
            raise ValueError(f"timeline {path}: {exc}") from None

    def current_lane(self) -> tuple[int, str]:
        """This worker's rank and host, or once it left its round the last ones it had."""
        rank, host = self._lane()
        if rank >= 0:
            self._known = (rank, host)
            return rank, host
        return self._known if self._known[0] >= 0 else (rank, host)

    def begin(self) -> None:
        self.current_lane()
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="elasticrun-timeline",
                                            daemon=True)
            self._thread.start()

    def wake(self) -> None:
        self.current_lane()  # called by the training thread, while it may still have a rank
        self._wake.set()

    def close(self, timeout: float) -> None:
        self._closing = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.debug("the timeline's last events were not sent within %gs", timeout)

    def _loop(self) -> None:
        while True:
            self._wake.wait(SEND_INTERVAL_S)
            self._wake.clear()
            closing = self._closing
            try:
                self._send_pending()
            except Exception as exc:  # never let the timeline take the worker down
                log.debug("sending timeline events failed: %s", exc)
            if closing:
                return

    def _send_pending(self) -> None:
        excess = len(_events) - MAX_PENDING
        for _ in range(max(0, excess)):
            _events.popleft()
            self._dropped += 1
        while _events and self.client is not None:
            named = set(self._named)
            batch: list[list[Any]] = []
            while _events and len(batch) < MAX_BATCH:
                batch.extend(self._encode(_events.popleft()))
            rank, host = self.current_lane()
            payload = {"worker_id": self._worker_id, "rank": rank, "host": host,
                       "events": batch, "dropped": self._dropped}
            try:
                reply = self.client.call(protocol.PATH_TIMELINE, payload)
            except (RequestRefusedError, DriverUnreachableError) as exc:
                log.debug("the driver did not take %d timeline event(s): %s", len(batch), exc)
                self._dropped += len(batch)
                self._named = named  # the names went with the lost batch
                return
            self._dropped = 0
            if reply.get("recording") is False:
                stop()  # the driver writes no timeline (a stray ELASTICRUN_TIMELINE=1)

    def _encode(self, event: Event) -> list[list[Any]]:
        """[phase, name, category, start (us), duration (us), tid, args], after the events
        that name the event's thread the first time it is used."""
        phase, name, category, start, duration, args = event
        base = _TIDS.get(category, OTHER_TID)
        if args:
            args = {key: value if type(value) in _SIMPLE else _plain(value)
                    for key, value in args.items()}
        # Whole microseconds (finer than a Python-level event can be placed); start and end
        # are rounded, not the duration, so that events that nest still do.
        begin, end = round(start * 1e6), round((start + duration) * 1e6)
        tid = base + 10 * self._tracks.place(base, begin, end) if phase == "X" else base
        encoded = [phase, name, category, begin, end - begin, tid, args]
        if tid in self._named:
            return [encoded]
        self._named.add(tid)
        extra = tid // 10
        thread = _THREADS[base] + (f" ({extra + 1})" if extra else "")
        return [["M", "thread_name", "__metadata", 0, 0, tid, {"name": thread}],
                ["M", "thread_sort_index", "__metadata", 0, 0, tid,
                 {"sort_index": base * 100 + extra}],
                encoded]


_SIMPLE = (int, bool, type(None))  # as they are; strings are cut, floats checked


def _plain(value: Any) -> Any:
    """A JSON value for an event's argument (the driver refuses NaN and objects)."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)[:TEXT_LIMIT]
