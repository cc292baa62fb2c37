"""A worker's pace: the share of its time the training thread spends outside collectives.

In synchronous training the slow member waits least, so this share, against the peers',
names the member that holds a round up (driver/rounds/pace.py). A `PaceMeter` sums what
the training thread waited: elasticrun's collectives add each wait (two clock reads they
take anyway, worker/liveness.py), a torchrun-style DDP script's reducer its gradient
reduction's (worker/ddp_pace.py, sampled). A `PaceReporter` thread sends the driver, about
every REPORT_S, the busy share of the interval since its last report, once at least one
wait completed in it (a long pause, a checkpoint save, is one interval, never several).

The time a round forms and its state is synced is left out: `restart()` at each new round
and again once the state is synced drops the interval in progress.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from elasticrun import protocol
from elasticrun.worker.client import DriverClient, DriverUnreachableError, RequestRefusedError

log = logging.getLogger("elasticrun.worker")

REPORT_S = 1.0  # an interval lasts at least this long
LOOK_S = 0.25  # how often the reporter looks whether one is due


class PaceMeter:
    """What a training thread waited in collectives. Written by the training thread (or a
    thread that times its collectives), read by the reporter: plain floats under the GIL,
    where a torn read costs one interval's precision at most."""

    def __init__(self) -> None:
        self.waited_s = 0.0  # totals since the process began
        self.span_s = 0.0  # sampled waits only: the span the samples covered
        self.waits = 0
        self.epoch = 0  # one more at each restart(): the interval in progress is dropped

    def waited(self, seconds: float) -> None:
        self.waited_s += seconds
        self.waits += 1

    def sampled(self, waited: float, span: float) -> None:
        """One sampled step: `waited` of its `span` seconds were spent in collectives."""
        self.waited_s += min(waited, span)
        self.span_s += span
        self.waits += 1

    def restart(self) -> None:
        self.epoch += 1


class PaceReporter:
    """Reports the busy share of each interval to the driver, on a daemon thread."""

    def __init__(self, meter: PaceMeter, client: DriverClient, worker_id: str,
                 round_number: Callable[[], int], sampled: bool = False) -> None:
        self.meter = meter
        self._client = client
        self._worker_id = worker_id
        self._round = round_number
        self._sampled = sampled  # the meter holds sampled steps: their span is the interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="elasticrun-pace", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        meter = self.meter
        start = (meter.epoch, time.monotonic(), meter.waited_s, meter.span_s, meter.waits)
        while not self._stop.wait(LOOK_S):
            now = time.monotonic()
            epoch, began, waited, span, waits = start
            if meter.epoch != epoch:
                start = (meter.epoch, now, meter.waited_s, meter.span_s, meter.waits)
                continue
            if now - began < REPORT_S or meter.waits == waits:
                continue
            interval = meter.span_s - span if self._sampled else now - began
            idle = meter.waited_s - waited
            start = (epoch, now, meter.waited_s, meter.span_s, meter.waits)
            if interval > 0:
                self._send(max(0.0, min(1.0, 1.0 - idle / interval)), now - began)

    def _send(self, busy: float, interval_s: float) -> None:
        try:
            self._client.call(protocol.PATH_PACE, {
                "worker_id": self._worker_id, "round": self._round(),
                "busy": round(busy, 4), "interval_s": round(interval_s, 3)})
        except (RequestRefusedError, DriverUnreachableError) as exc:
            log.debug("the driver did not take the pace report: %s", exc)


def measuring() -> bool:
    """Whether this job measures pace (--stragglers report|evict; not off)."""
    return os.environ.get(protocol.ENV_STRAGGLERS, "report") != "off"
