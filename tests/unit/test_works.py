"""works.py's pure logic against fake works: sliced waits and what a round keeps in flight.
(Real Gloo works, a stranded collective and a worker's exit: tests/collectives/test_abandon.)"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from elasticrun.torch.world.works import WAIT_SLICE, InFlight, wait_abortably
from elasticrun.worker.elastic import WorkersFailedError


class FakeWork:
    """Ends when `end()` is called (with an error, optionally); `wait(timeout)` behaves as
    torch's: it raises "Operation timed out!" when the timeout passes first."""

    def __init__(self) -> None:
        self._ended = threading.Event()
        self._error: Exception | None = None
        self.waits = 0

    def end(self, error: Exception | None = None) -> None:
        self._error = error
        self._ended.set()

    def is_completed(self) -> bool:
        return self._ended.is_set()

    def wait(self, timeout: timedelta | None = None) -> bool:
        self.waits += 1
        if not self._ended.wait(None if timeout is None else timeout.total_seconds()):
            raise RuntimeError("Operation timed out!")
        if self._error is not None:
            raise self._error
        return True


def later(seconds: float, action: object) -> None:
    threading.Timer(seconds, action).start()  # type: ignore[arg-type]


def test_a_wait_returns_when_its_work_ends() -> None:
    work = FakeWork()
    later(0.1, work.end)
    wait_abortably(work, lambda: False, bound_s=5, round_number=1)
    assert work.waits >= 2  # it waited in slices


def test_a_work_that_ends_with_an_error_raises_that_error() -> None:
    work = FakeWork()
    later(0.05, lambda: work.end(RuntimeError("Connection closed by peer")))
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        wait_abortably(work, lambda: False, bound_s=5, round_number=1)


def test_an_abort_abandons_the_work_within_a_slice() -> None:
    work, aborted = FakeWork(), threading.Event()
    later(0.1, aborted.set)
    started = time.monotonic()
    with pytest.raises(WorkersFailedError, match="round 7 broke while a collective"):
        wait_abortably(work, aborted.is_set, bound_s=5, round_number=7)
    assert time.monotonic() - started < 0.1 + 5 * WAIT_SLICE.total_seconds()


def test_an_aborted_round_still_gives_a_finished_works_result() -> None:
    work = FakeWork()
    work.end()
    wait_abortably(work, lambda: True, bound_s=5, round_number=1)


def test_the_bound_abandons_a_work_gloo_never_ends() -> None:
    with pytest.raises(WorkersFailedError):
        wait_abortably(FakeWork(), lambda: False, bound_s=0.1, round_number=1)


def test_in_flight_keeps_only_the_works_still_running() -> None:
    in_flight = InFlight()
    first, second, third = FakeWork(), FakeWork(), FakeWork()
    in_flight.add(first)
    in_flight.add(second)
    first.end()
    in_flight.add(third)  # the ended first one is let go
    assert len(in_flight._works) == 2
    third.end()
    assert in_flight.pending() == [second]
    assert in_flight.pending() == []  # the round's works were handed over
