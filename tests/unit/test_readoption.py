"""The resumed driver's decision, as a table: the kept state and the reports -> what it does."""

from __future__ import annotations

import pytest

from elasticrun.driver.rounds import events as ev
from elasticrun.driver.rounds.readoption import (
    FailMissing,
    FreshRound,
    Readopt,
    Refuse,
    Wait,
    decide,
    unknown,
)
from elasticrun.driver.rounds.state import JobPhase, JobState
from tests.unit.machine_sim import Sim


def running() -> tuple[JobState, list[str]]:
    """Round 1 complete on a (2) and b (2), every member synced."""
    sim = Sim()
    sim.running({"a": 2, "b": 2})
    assert sim.state.round is not None and sim.state.round.complete
    return sim.state, sorted(sim.state.round.members.values())


def forming() -> tuple[JobState, list[str]]:
    """Round 2 opened after a failure; nobody has joined it yet."""
    sim = Sim()
    sim.running({"a": 2, "b": 2})
    sim.send(ev.WorkerExited(sim.worker_on("b", 0).id, 1))
    sim.advance(1.0)
    assert sim.state.round is not None and not sim.state.round.complete
    return sim.state, sorted(w.id for w in sim.state.workers.values() if w.alive)


def test_every_member_back_in_its_round_is_readopted_as_it_is() -> None:
    state, members = running()
    assert decide(state, {w: 1 for w in members}, False) == Readopt(tuple(members))


def test_members_still_missing_are_waited_for_until_the_bound_then_failed() -> None:
    state, members = running()
    back = {w: 1 for w in members[:3]}
    assert decide(state, back, False) == Wait((members[3],))
    assert decide(state, back, True) == FailMissing((members[3],), tuple(members[:3]))


def test_a_round_that_was_forming_is_replaced_by_a_fresh_one() -> None:
    state, alive = forming()
    back = {w: 1 for w in alive}
    decision = decide(state, back, False)
    assert isinstance(decision, FreshRound) and decision.back == tuple(alive)
    assert decide(state, {alive[0]: 1}, False) == Wait(tuple(alive[1:]))
    late = decide(state, {alive[0]: 1}, True)
    assert isinstance(late, FreshRound) and late.back == (alive[0],)


def test_a_member_in_another_round_than_the_kept_one_opens_a_fresh_round() -> None:
    state, members = running()
    reports = {w: 1 for w in members}
    reports[members[0]] = 2
    decision = decide(state, reports, False)
    assert isinstance(decision, FreshRound) and f"{members[0]} is in round 2" in decision.why


@pytest.mark.parametrize("bound_passed", [False, True])
def test_an_ended_job_is_not_resumed(bound_passed: bool) -> None:
    state, members = running()
    state.phase = JobPhase.STOPPED
    assert isinstance(decide(state, {w: 1 for w in members}, bound_passed), Refuse)


def test_a_worker_the_journal_does_not_know_is_told_to_exit_and_not_counted() -> None:
    state, members = running()
    reports = {**{w: 1 for w in members}, "stranger": 1}
    assert unknown(state, reports) == ("stranger",)
    assert decide(state, reports, False) == Readopt(tuple(members))
