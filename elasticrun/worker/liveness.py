"""A worker's side of hang detection: nothing is sent while collectives flow.

`CollectiveClock` notes when the training thread enters and leaves each collective (two
clock reads) and how long collectives usually wait. A wait far longer than usual (4x, and
at least a quarter second) means a peer may be hung: `StallReporter`, a thread of its own,
tells the driver so, and again every second while the wait lasts. When a round stalls,
all its members wait at once: only a few of them (every stride-th rank, at most about 8)
report at that bound; the others report at three times it, and only if the driver has not
begun probing the round meanwhile, so a stall of 4,096 workers costs the driver a handful
of reports (and still one, should every designated reporter be the hung one). Each
member's notice watcher answers a probe with `CollectiveClock.snapshot()`: whether its
training thread is in a collective, since when, and how much CPU it has used (a thread
stuck outside collectives uses none). See driver/rounds/liveness.py.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from elasticrun import protocol
from elasticrun.system.process_view import thread_cpu_seconds
from elasticrun.worker.client import DriverClient, DriverUnreachableError, RequestRefusedError
from elasticrun.worker.pace import PaceMeter

log = logging.getLogger("elasticrun.worker")

STALL_MIN_S = 0.25  # a wait shorter than this is never a stall
STALL_FACTOR = 4.0  # ... nor one shorter than this many usual waits
STALL_REPEAT_S = 1.0  # a lasting stall is reported again this often (the driver's lapse: 2.5 s)
USUAL_WEIGHT = 0.2  # how much each completed wait moves the usual wait
REPORTERS = 8  # about this many members of a round report its stalls at once
LATE_FACTOR = 3.0  # the others wait this many bounds, and report if nobody probes


class CollectiveClock:
    """Whether the training thread is in a collective, since when, and its usual wait."""

    def __init__(self, pace: PaceMeter | None = None) -> None:
        self._entered: float | None = None
        self._left = time.monotonic()
        self._thread = threading.main_thread().native_id or 0
        self.usual_s = 0.0
        self.pace = pace  # (stragglers: what the training thread waited, worker/pace.py)

    def stall_after(self) -> float:
        """How long a wait may last before it is reported as a stall."""
        return max(STALL_MIN_S, STALL_FACTOR * self.usual_s)

    def enter(self) -> float:
        self._thread = threading.get_native_id()  # the thread that trains
        self._entered = now = time.monotonic()
        return now

    def leave(self, entered: float, completed: bool) -> None:
        self._left = now = time.monotonic()
        self._entered = None
        if completed:  # a wait a broken round cut short says nothing of the usual
            self.usual_s += USUAL_WEIGHT * (now - entered - self.usual_s)
            if self.pace is not None:
                self.pace.waited(now - entered)

    def restart(self) -> None:
        """A new round: the training thread has been outside collectives since now."""
        self._entered = None
        self._left = time.monotonic()
        if self.pace is not None:
            self.pace.restart()

    def snapshot(self) -> dict[str, Any]:
        """What a probe answer says (read from another thread: a torn read is harmless)."""
        entered, now = self._entered, time.monotonic()
        return {"in_collective": entered is not None,
                "since_s": now - (entered if entered is not None else self._left),
                "cpu_s": thread_cpu_seconds(os.getpid(), self._thread)}


class StallReporter:
    """Tells the driver about a stalled collective without holding up the wait: the training
    thread only hands over the report; a daemon thread, started at the first one, sends it."""

    def __init__(self, client: DriverClient, worker_id: str) -> None:
        self._client = client
        self._worker_id = worker_id
        self._pending: tuple[int, float] | None = None
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def stalled(self, round_number: int, waited_s: float) -> None:
        self._pending = (round_number, waited_s)
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="elasticrun-stalls",
                                            daemon=True)
            self._thread.start()
        self._wake.set()

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            pending, self._pending = self._pending, None
            if pending is None:
                continue
            try:
                self._client.call(protocol.PATH_STALLED, {
                    "worker_id": self._worker_id, "round": pending[0],
                    "waited_s": round(pending[1], 3)})
            except (RequestRefusedError, DriverUnreachableError) as exc:
                log.debug("the driver did not take the stall report: %s", exc)


class StallWatch:
    """The clock and the reporter of one worker, as a round's waits use them.
    `probed(round, since)`: whether the driver has probed `round` since that moment."""

    def __init__(self, clock: CollectiveClock, reporter: StallReporter,
                 probed: Callable[[int, float], bool] = lambda number, since: False,
                 reporting: bool = True) -> None:
        self.clock = clock
        self._reporter = reporter
        self._probed = probed
        self._reporting = reporting  # False: --no-hang-detection (the clock times pace only)

    def stall_after(self, rank: int, size: int) -> tuple[float, bool]:
        """How long this worker's wait may last before it reports it, and whether it is
        one of the round's designated reporters."""
        if not self._reporting:
            return float("inf"), False
        designated = rank % max(1, size // REPORTERS) == 0
        bound = self.clock.stall_after()
        return (bound, True) if designated else (LATE_FACTOR * bound, False)

    def report(self, round_number: int, waited_s: float, designated: bool,
               waiting_since: float) -> None:
        if designated or not self._probed(round_number, waiting_since):
            self._reporter.stalled(round_number, waited_s)


def watch_stalls(client: DriverClient, worker_id: str, probed: Callable[[int, float], bool],
                 pace: PaceMeter | None = None) -> StallWatch | None:
    """A launched worker's watch; None with --no-hang-detection and no `pace` to time
    (its waits note nothing)."""
    reporting = os.environ.get(protocol.ENV_HANG_DETECTION, "1") != "0"
    if not reporting and pace is None:
        return None
    return StallWatch(CollectiveClock(pace), StallReporter(client, worker_id), probed,
                      reporting)
