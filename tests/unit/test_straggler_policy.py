"""A slow worker is named, not failed: the pace policy (pace.py) as tables, and through the
round machine (stragglers.py) as state -> pace reports -> actions."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from elasticrun.driver.operate.telemetry import Telemetry
from elasticrun.driver.rounds import events as ev
from elasticrun.driver.rounds.pace import (
    CLEAR,
    EVICT_GAIN,
    MARGIN,
    PERSIST,
    TICK_S,
    WINDOW,
    PaceBook,
    PaceReport,
    note,
    projected_gain,
    slowdowns,
    tick,
)
from tests.unit.machine_sim import Sim, config, of, reports

MEMBERS = ("w0", "w1", "w2", "w3")
STEADY = {"w0": 0.2, "w1": 0.21, "w2": 0.19, "w3": 0.2}  # each waits ~4/5 of a step for w3
SLOW_W3 = {"w0": 0.2, "w1": 0.21, "w2": 0.19, "w3": 0.98}  # w3 5x slower: it never waits


# --- the policy -----------------------------------------------------------------------------
@pytest.mark.parametrize(("busy", "expected"), [
    ({"a": 0.5, "b": 0.5, "c": 0.5, "d": 0.5}, {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0}),
    (SLOW_W3, {"w0": 0.95, "w1": 1.05, "w2": 0.9, "w3": 4.9}),
    ({"a": 0.9, "b": 0.9}, {"a": 1.0, "b": 1.0}),  # a job slowed down as a whole
    ({"a": 1.0, "b": 0.0, "c": 0.0}, {"a": 100.0, "b": 0.0, "c": 0.0}),  # (finite)
    ({"a": 0.7}, {"a": 1.0}),  # alone: nobody to be slower than
])
def test_a_members_slowdown_is_its_busy_share_over_its_peers_median(
        busy: dict[str, float], expected: dict[str, float]) -> None:
    assert slowdowns(busy) == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize(("busy", "gain"), [
    ({"a": 0.2, "b": 0.2, "c": 0.2, "d": 1.0}, 3.75),  # 5x of 4: a job of 3 at its pace
    ({"a": 0.5, "b": 0.5, "c": 0.5, "d": 1.0}, 1.5),
    ({"a": 0.8, "b": 0.8, "c": 0.8, "d": 0.96}, 0.9),  # 1.2x: one fewer costs more
    ({"a": 0.2, "b": 0.5, "c": 0.2, "d": 1.0}, 1.5),  # the next slowest sets the pace
    ({"a": 0.2, "d": 1.0}, 2.5),  # two: the other trains alone, 5x as fast
])
def test_the_projected_gain_of_leaving_a_straggler_out(busy: dict[str, float],
                                                       gain: float) -> None:
    assert projected_gain(busy, "d") == pytest.approx(gain)


def judge(pattern: str, busy: Callable[[int, bool], dict[str, float]] | None = None
          ) -> list[tuple[int, str, bool]]:
    """Ticks a second apart; at tick i w3 is slow when pattern[i] is "S" (else steady):
    the (tick, worker, named) changes."""
    book, now, out = PaceBook(), 0.0, []
    for i, mark in enumerate(pattern):
        shares = (busy or (lambda _, slow: SLOW_W3 if slow else STEADY))(i, mark == "S")
        for worker in MEMBERS:
            note(book, worker, PaceReport(1, shares[worker], TICK_S), now)
        changes = tick(book, MEMBERS, 1, now)
        assert changes is not None
        out += [(i, change.worker, change.named) for change in changes]
        now += TICK_S
    return out


@pytest.mark.parametrize(("pattern", "changes"), [
    ("S" * 7, []),  # 7 seconds slow: not yet
    ("S" * 8, [(7, "w3", True)]),  # persistently slow: named at its 8th slow tick
    ("....SSSS......", []),  # a 4-second pause: never
    ("..SSSSSSS....SSSSS...", []),  # pauses of 7 s then 5 s, apart: never 8 of 10
    ("S" * 12 + "." * 10, [(7, "w3", True), (19, "w3", False)]),  # it keeps pace again
    ("S" * 8 + ".S" * 6, [(7, "w3", True)]),  # half the time slow: still one
])
def test_a_straggler_is_one_persistently_slower_than_its_peers(
        pattern: str, changes: list[tuple[int, str, bool]]) -> None:
    assert judge(pattern) == changes


def test_a_job_slowed_down_as_a_whole_names_nobody() -> None:
    assert judge("S" * 20, lambda i, slow: {w: 0.95 for w in MEMBERS} if slow
                 else STEADY) == []


def test_a_member_without_a_new_report_holds_the_tick() -> None:
    """A stopped member (no report since the last tick) names nobody: hang detection's."""
    book = PaceBook()
    for worker in MEMBERS:
        note(book, worker, PaceReport(1, SLOW_W3[worker], 1.0), 0.0)
    assert tick(book, MEMBERS, 1, 0.0) == []
    for worker in MEMBERS[1:]:
        note(book, worker, PaceReport(1, SLOW_W3[worker], 1.0), 1.0)
    assert tick(book, MEMBERS, 1, 1.0) is None  # w0 said nothing new
    note(book, "w0", PaceReport(2, 0.2, 1.0), 1.0)
    assert tick(book, MEMBERS, 1, 1.0) is None  # ... of this round


def test_the_documented_thresholds() -> None:
    """docs/guides/stragglers.md quotes these numbers: change both together."""
    assert (MARGIN, WINDOW, PERSIST, CLEAR, TICK_S, EVICT_GAIN) == (1.3, 10, 8, 2, 1.0, 1.1)


# --- through the round machine --------------------------------------------------------------
def paced(sim: Sim, slow_index: int, seconds: int, others: float = 0.2) -> list[ev.Action]:
    """Every member reports each second; the one in slot ("b", slow_index) never waits
    (the others' busy share: `others`; 0.2: it is 5x slower)."""
    out: list[ev.Action] = []
    for _ in range(seconds):
        out += sim.advance(TICK_S)
        for worker in sim.members():
            slow = worker.slot.host == "b" and worker.slot.index == slow_index
            out += sim.send(ev.WorkerPaced(worker.id, sim.state.round_number,
                                           1.0 if slow else others, 1.0))
    return out


def named(actions: list[ev.Action]) -> list[dict[str, object]]:
    return [dict(a.fields) for a in of(ev.Report, actions) if a.name == "straggler"]


def test_reported_the_straggler_keeps_its_place() -> None:
    sim = Sim(config(np=4, min_np=2))
    sim.running({"a": 2, "b": 2})
    actions = paced(sim, 1, PERSIST + 2)
    [event] = named(actions)
    assert (event["host"], event["action"], event["reason"]) == \
        ("b", "reported", "--stragglers report")
    assert event["rank"] == sim.worker_on("b", 1).rank and event["slowdown"] == 5.0
    assert "worker_slowdowns" in reports(actions) and of(ev.PostNotice, actions) == []


def test_evicted_the_straggler_leaves_at_the_next_commit_and_its_slot_cools_down() -> None:
    sim = Sim(config(np=4, min_np=2, stragglers="evict", blacklist_cooldown=(30.0, 30.0)))
    sim.running({"a": 2, "b": 2})
    straggler = sim.worker_on("b", 1)
    actions = paced(sim, 1, PERSIST + 2)
    [event] = named(actions)
    assert event["action"] == "evicted" and event["projected_gain"] == 3.75
    [notice] = of(ev.PostNotice, actions)  # the round makes room at its next commit
    assert notice.update.name == "removed" and of(ev.BreakRound, actions) == []
    assert sim.state.hosts.slot_blacklisted("b", 1, sim.now)
    assert not sim.state.hosts.slot_blacklisted("b", 1, sim.now + 31.0)
    assert straggler.alive and of(ev.StopWorkers, actions) == []  # until that commit


@pytest.mark.parametrize(("min_np", "others", "reason"), [
    (4, 0.2, "without it the job would have fewer than --min-np 4 slots"),
    (2, 0.74, "the job is projected no faster without it (1.01x its speed now)"),  # 1.35x
])
def test_evict_asked_a_straggler_is_kept_when_the_job_would_lose(
        min_np: int, others: float, reason: str) -> None:
    sim = Sim(config(np=4, min_np=min_np, stragglers="evict"))
    sim.running({"a": 2, "b": 2})
    actions = paced(sim, 1, PERSIST + 2, others)
    [event] = named(actions)
    assert (event["action"], event["reason"]) == ("kept", reason)
    assert of(ev.PostNotice, actions) == []


def test_off_nothing_is_judged() -> None:
    sim = Sim(config(np=4, min_np=2, stragglers="off"))
    sim.running({"a": 2, "b": 2})
    actions = paced(sim, 1, 2 * WINDOW)
    assert named(actions) == [] and "worker_slowdowns" not in reports(actions)


def test_the_gauge_holds_the_latest_ticks_members_and_the_counter_counts_by_action() -> None:
    telemetry = Telemetry("job")
    telemetry.worker_slowdowns([(0, "a", 1.0), (1, "b", 4.9)])
    telemetry.worker_slowdowns([(0, "a", 1.02), (1, "a", 0.98)])  # a new round's ranks
    telemetry.straggler(rank=1, host="a", slowdown=4.9, action="kept", reason="r",
                        projected_gain=0.9)
    text = telemetry.metrics.render().decode()
    assert 'elasticrun_worker_slowdown{host="a",rank="1"} 0.98' in text
    assert 'host="b"' not in text
    assert 'elasticrun_stragglers_total{action="kept"} 1.0' in text
