"""A worker's side of hang detection (worker/liveness.py): when a wait is a stall, who
reports it, and what a probe answer says."""

from __future__ import annotations

import threading
import time

import pytest

from elasticrun.worker.liveness import (
    LATE_FACTOR,
    STALL_MIN_S,
    CollectiveClock,
    StallWatch,
)


class Reporter:
    def __init__(self) -> None:
        self.reports: list[tuple[int, float]] = []

    def stalled(self, round_number: int, waited_s: float) -> None:
        self.reports.append((round_number, waited_s))


def watch(probed: bool = False) -> tuple[StallWatch, Reporter]:
    reporter = Reporter()
    return StallWatch(CollectiveClock(), reporter, lambda number, since: probed), reporter  # type: ignore[arg-type]


def test_a_wait_is_a_stall_past_four_usual_waits_and_never_below_the_minimum() -> None:
    clock = CollectiveClock()
    assert clock.stall_after() == STALL_MIN_S
    for _ in range(50):  # waits of about 0.2 s are usual here
        entered = clock.enter()
        clock.leave(entered - 0.2, completed=True)
    assert 0.75 < clock.stall_after() < 0.85
    entered = clock.enter()
    clock.leave(entered - 30.0, completed=False)  # a broken round's wait: not usual
    assert 0.75 < clock.stall_after() < 0.85


@pytest.mark.parametrize(("size", "designated"), [
    (1, [0]), (4, [0, 1, 2, 3]), (16, [0, 2, 4, 6, 8, 10, 12, 14]),
    (4096, [0, 512, 1024, 1536, 2048, 2560, 3072, 3584])])
def test_about_eight_members_of_a_round_report_its_stalls_first(size: int,
                                                                designated: list[int]) -> None:
    stall_watch, _ = watch()
    bounds = [stall_watch.stall_after(rank, size) for rank in range(size)]
    assert [r for r, (_, first) in enumerate(bounds) if first] == designated
    assert {after for after, first in bounds if first} == {STALL_MIN_S}
    assert {after for after, first in bounds if not first} <= {LATE_FACTOR * STALL_MIN_S}


def test_the_others_report_only_when_nobody_probes_the_round() -> None:
    quiet, reporter = watch(probed=True)
    quiet.report(3, 1.0, designated=False, waiting_since=0.0)
    assert reporter.reports == []
    quiet.report(3, 1.0, designated=True, waiting_since=0.0)  # designated: always
    unprobed, reporter = watch(probed=False)
    unprobed.report(3, 1.0, designated=False, waiting_since=0.0)
    assert reporter.reports == [(3, 1.0)]


def test_a_probe_answer_says_where_the_training_thread_is() -> None:
    clock = CollectiveClock()
    outside = clock.snapshot()
    assert outside["in_collective"] is False and outside["cpu_s"] is not None
    entered = clock.enter()
    time.sleep(0.05)
    inside = clock.snapshot()
    assert inside["in_collective"] is True and inside["since_s"] >= 0.05
    clock.leave(entered, completed=True)
    assert clock.snapshot()["in_collective"] is False


def test_the_cpu_in_an_answer_is_the_training_threads() -> None:
    """Read from the watcher thread: a busy training thread's CPU grows, an idle one's not."""
    clock = CollectiveClock()
    stop = threading.Event()

    def train() -> None:
        clock.enter()
        clock.leave(time.monotonic(), completed=True)  # this thread trains
        while not stop.is_set():
            sum(range(10_000))

    trainer = threading.Thread(target=train)
    trainer.start()
    try:
        time.sleep(0.1)
        before = clock.snapshot()["cpu_s"]
        # This thread only sleeps: what grows is the trainer's CPU. On a loaded machine the
        # trainer gets a fraction of a core, so the growth is awaited, not timed.
        deadline = time.monotonic() + 20
        while clock.snapshot()["cpu_s"] - before <= 0.05 and time.monotonic() < deadline:
            time.sleep(0.05)
        after = clock.snapshot()["cpu_s"]
    finally:
        stop.set()
        trainer.join()
    assert after - before > 0.05
