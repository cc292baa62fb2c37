"""A dead worker costs its slot, not its host: the evidence policy (evidence.py) as a table,
and through the round machine (slot_failures.py) as state -> event -> actions."""

from __future__ import annotations

import pytest

from elasticrun.driver.rounds import events as ev
from elasticrun.driver.rounds.assignment import SlotId
from elasticrun.driver.rounds.evidence import (
    CRASH_LOOP_STRIKES,
    HOST_STRIKES,
    SLOT_STRIKES,
    WORKED_RUN_S,
    Blame,
    Strikes,
    charge,
    worked,
)
from elasticrun.driver.rounds.step import FAILURE_COLLECTION_S
from elasticrun.system.process_view import ProcessState, ProcessView
from tests.unit.machine_sim import Sim, config, of, reports

A0, A1, A2, B0 = SlotId("a", 0), SlotId("a", 1), SlotId("a", 2), SlotId("b", 0)


# --- the policy -----------------------------------------------------------------------------
@pytest.mark.parametrize(("failures", "blame", "strikes"), [
    ([A0], Blame.NOBODY, 1),  # one death says nothing about the machine
    ([A0, A0], Blame.NOBODY, 2),
    ([A0, A0, A0], Blame.SLOT, 3),  # a slot that keeps failing: a dead GPU
    ([A0, A0, A0, A0], Blame.SLOT, 4),  # back from its cooldown, and failing again
    ([A0, B0, A0, B0, A0], Blame.SLOT, 3),  # other hosts' failures are theirs
    ([A0, A1], Blame.NOBODY, 1),  # two slots once each: 2 of 3
    ([A0, A1, A0], Blame.HOST, 3),  # 3 failures on 2 slots: the host
    ([A0, A1, A2], Blame.HOST, 3),
    ([B0, B0, A0, A1], Blame.NOBODY, 1),  # b's two are b's alone (one slot)
])
def test_whom_a_failure_blames(failures: list[SlotId], blame: Blame, strikes: int) -> None:
    record: dict[SlotId, Strikes] = {}
    verdicts = [charge(record, slot, f"{slot} died") for slot in failures]
    assert (verdicts[-1].blame, verdicts[-1].strikes) == (blame, strikes)
    assert record[failures[-1]].cause == f"{failures[-1]} died"


def test_a_worker_that_worked_forgives_its_slots_failures_only() -> None:
    record: dict[SlotId, Strikes] = {}
    charge(record, A0, "x")
    charge(record, A0, "x")
    charge(record, A1, "y")
    assert worked(record, A0) and not worked(record, A0)  # once: nothing left to forgive
    assert charge(record, A0, "x").blame is Blame.NOBODY  # a new first failure
    assert record[A1].count == 1


def test_the_documented_thresholds() -> None:
    """The failure model's page quotes these numbers: change both together."""
    assert (SLOT_STRIKES, HOST_STRIKES, CRASH_LOOP_STRIKES, WORKED_RUN_S) == (3, 3, 5, 60.0)


# --- through the round machine --------------------------------------------------------------
def _kill(sim: Sim, slot: SlotId, code: int = -9) -> list[ev.Action]:
    """The newest worker of `slot` dies; the next round is cut; new workers start."""
    actions = sim.send(ev.WorkerExited(sim.worker_on(slot.host, slot.index).id, code))
    actions += sim.advance(FAILURE_COLLECTION_S)
    return actions + sim.started(actions)


def test_one_machine_keeps_training_through_crash_after_crash_while_each_new_worker_works(
) -> None:
    """-np 2 on one host (--min-np 2): each death, its neighbour keeps its process and
    waits for the slot's new worker; a new worker that reaches a commit forgives the slot,
    so no number of such crashes ends the job."""
    sim = Sim(config(np=2, min_np=2))
    sim.running({"a": 2})
    neighbour = sim.worker_on("a", 0)
    for _ in range(2 * CRASH_LOOP_STRIKES):
        actions = _kill(sim, A1)
        assert [o.new_workers for o in of(ev.OpenRound, actions)] == [1]
        assert of(ev.Fail, actions) == [] and of(ev.StopWorkers, actions) == []
        sim.join_all(last_round=sim.state.round_number - 1)
        sim.sync_all()
        sim.send(ev.WorkerTrained(sim.worker_on("a", 1).id))  # its first commit
    assert neighbour.alive and sim.worker_on("a", 0) is neighbour
    assert not sim.state.hosts.holds_out("a", sim.now) and sim.state.strikes == {}
    assert sim.state.round_number == 2 * CRASH_LOOP_STRIKES + 1


def test_a_crash_loop_blacklists_the_slot_then_ends_the_job_naming_it() -> None:
    """Every new worker of a[1] dies before its first commit: at 3 the slot is blacklisted
    (its neighbour waits for its cooldown, short of --min-np), and at 5 the job ends, as
    it cannot go on without it."""
    sim = Sim(config(np=2, min_np=2, blacklist_cooldown=(1.0, 2.0)))
    sim.running({"a": 2})
    for _ in range(SLOT_STRIKES - 1):
        _kill(sim, A1, code=1)
    assert not sim.state.hosts.holds_out("a", sim.now)
    actions = _kill(sim, A1, code=1)
    assert "slot_blacklisted" in reports(actions)
    [warning] = [a.message for a in of(ev.Log, actions) if "blacklisted" in a.message]
    assert warning.startswith("slot a[1] blacklisted for ")
    assert "3 failures in a row, none of its workers reached a commit" in warning
    assert of(ev.OpenRound, actions) == [] and sim.state.capacity_deadline is not None
    # Back after its cooldown: a new worker, which fails again (4), back again, fails (5).
    actions = sim.advance(2.0)
    assert "slot_restored" in reports(actions) and of(ev.OpenRound, actions)
    sim.started(actions)
    _kill(sim, A1, code=1)
    actions = sim.advance(4.0)
    sim.started(actions)
    [fail] = of(ev.Fail, _kill(sim, A1, code=1))
    assert fail.message.startswith(
        "slot a[1] keeps failing: 5 failures in a row, none of its workers reached a "
        "commit, and the job cannot go on without it (1 slot(s) left, --min-np 2); last: "
        "rank 1 on host a exited with code 1")


def test_a_slot_that_keeps_failing_is_left_out_alone_and_the_job_goes_on() -> None:
    sim = Sim(config(np=4, min_np=2))
    sim.running({"a": 2, "b": 2})
    for _ in range(SLOT_STRIKES):
        _kill(sim, SlotId("b", 1), code=1)
    assert sim.state.hosts.slot_blacklisted("b", 1, sim.now)
    assert not sim.state.hosts.is_blacklisted("b", sim.now)
    sim.join_all(last_round=sim.state.round_number - 1)
    sim.sync_all()
    assert sorted(map(str, sim.state.assignment)) == ["a[0]", "a[1]", "b[0]"]
    assert of(ev.Fail, sim.log) == []


def test_a_host_whose_workers_keep_failing_is_blacklisted_and_the_job_goes_on() -> None:
    """b's workers fail at every start, on both of its slots: after 3 in all, b is
    blacklisted (its workers stopped), the job trains on a."""
    sim = Sim(config(np=4, min_np=2))
    sim.running({"a": 2, "b": 2})
    _kill(sim, SlotId("b", 0), code=1)
    actions = _kill(sim, SlotId("b", 1), code=1)
    assert "host_blacklisted" not in reports(sim.log)
    refills = [s.worker for s in of(ev.Spawn, actions)]
    actions = sim.send(ev.WorkerExited(sim.worker_on("b", 0).id, 1))
    assert "host_blacklisted" in reports(actions)
    [warning] = [a.message for a in of(ev.Log, actions) if a.message.startswith("host b")]
    assert "its workers failed 3 times in a row, on 2 of its slots); blacklisted for" \
        in warning
    assert set(refills) <= {w for s in of(ev.StopWorkers, actions) for w in s.workers}
    sim.advance(FAILURE_COLLECTION_S)
    assert {s.host for s in sim.state.assignment} == {"a"} and of(ev.Fail, sim.log) == []


def test_a_host_that_does_not_answer_or_loses_its_agent_is_blacklisted_at_once() -> None:
    sim = Sim(config(np=4, min_np=2))
    sim.running({"a": 2, "b": 2})
    actions = sim.send(ev.WorkerExited(sim.worker_on("b", 1).id, 1, host_lost=True))
    assert "host_blacklisted" in reports(actions)
    assert of(ev.StopWorkers, actions) == [ev.StopWorkers((sim.worker_on("b", 0).id,))]


def test_restart_mode_charges_the_failing_slot_and_forgives_workers_that_ran() -> None:
    """A torchrun-style round restarts whole; the worker that failed is charged, and a
    member that ran WORKED_RUN_S has worked."""
    sim = Sim(config(np=2, min_np=2, max_restarts=10))
    sim.start({"a": 2})
    for _ in range(SLOT_STRIKES - 1):
        actions = sim.send(ev.WorkerExited(sim.worker_on("a", 1).id, 1))
        for stop in of(ev.StopWorkers, actions):
            for worker in stop.workers:
                actions += sim.send(ev.WorkerExited(worker, -15))
        sim.started(actions + sim.advance(0.0))
    assert sim.state.strikes[A1].count == SLOT_STRIKES - 1 and sim.state.restarts == 2
    sim.advance(WORKED_RUN_S)  # the restarted round runs a minute
    actions = sim.send(ev.WorkerExited(sim.worker_on("a", 1).id, 1))
    assert sim.state.strikes[A1].count == 1 and "slot_blacklisted" not in reports(actions)


def _restart_after(sim: Sim, actions: list[ev.Action]) -> list[ev.Action]:
    """The stopped members of a restarting round exit; the next round's workers start."""
    for stop in of(ev.StopWorkers, actions):
        for worker in stop.workers:
            actions = actions + sim.send(ev.WorkerExited(worker, -15))
    actions += sim.advance(0.0)
    return actions + sim.started(actions)


def test_restart_mode_blacklists_a_slot_that_keeps_failing_when_the_job_goes_on_without_it(
) -> None:
    sim = Sim(config(np=4, min_np=2, max_restarts=10))
    sim.start({"a": 2, "b": 2})
    for _ in range(SLOT_STRIKES):
        actions = _restart_after(sim, sim.send(
            ev.WorkerExited(sim.worker_on("b", 1).id, 1)))
    assert "slot_blacklisted" in reports(actions)
    assert sorted(map(str, of(ev.OpenRound, actions)[-1].assignment)) == [
        "a[0]", "a[1]", "b[0]"]


def test_restart_mode_leaves_repeated_failures_to_max_restarts_when_it_needs_the_slot(
) -> None:
    """-np 2 on one host: blacklisting a[1] would only make the job wait; --max-restarts
    ends it, with torchrun's message."""
    sim = Sim(config(np=2, min_np=2, max_restarts=3))
    sim.start({"a": 2})
    for _ in range(3):
        _restart_after(sim, sim.send(ev.WorkerExited(sim.worker_on("a", 1).id, 1)))
    assert "slot_blacklisted" not in reports(sim.log) and sim.state.restarts == 3
    actions = _restart_after(sim, sim.send(ev.WorkerExited(sim.worker_on("a", 1).id, 1)))
    [fail] = of(ev.Fail, actions)
    assert fail.message == ("rank 1 on host a exited with code 1; --max-restarts 3 spent "
                            "(restarted 3 time(s))")


def test_a_job_that_never_trained_ends_at_its_first_blacklisting() -> None:
    """Both workers fail at every start, before any commit (a missing file, an import error):
    at 3 failures on its 2 slots the host is blacklisted, and rather than wait for its
    cooldown the job ends, naming the failure."""
    sim = Sim(config(np=2, min_np=2))
    sim.start({"a": 2})
    sim.join_all()
    sim.sync_all()  # no commit: nothing worked
    _kill(sim, A0, code=1)
    actions = _kill(sim, A1, code=1)
    actions = sim.send(ev.WorkerExited(sim.worker_on("a", 0).id, 1))
    [fail] = of(ev.Fail, actions)
    assert fail.message.startswith("host a keeps failing: 3 failures in a row")
    assert "(0 slot(s) left, --min-np 2); last: rank 1 on host a exited with code 1" \
        in fail.message


def test_a_hung_member_of_a_restarting_round_is_forgotten_once() -> None:
    """Its exit comes after the restart's cut opened the next round (which forgets the old
    round's dead workers): nothing is forgotten twice."""
    sim = Sim(config(np=2, min_np=2))
    sim.start({"a": 2})
    stopped, reporter = sim.worker_on("a", 0), sim.worker_on("a", 1)
    sim.send(ev.WorkerStalled(reporter.id, 1, 2.0))
    actions = sim.send(ev.ProcessesInspected(1, (
        (stopped.id, ProcessView(ProcessState.STOPPED, "stopped (SIGSTOP)")),)))
    sim.send(ev.WorkerExited(reporter.id, -15))  # stopped for the restart: the cut opens
    assert of(ev.OpenRound, sim.log)
    assert ev.StopWorkers((stopped.id,), kill=True) in actions
    assert of(ev.Fail, sim.send(ev.WorkerExited(stopped.id, -9))) == []
    assert stopped.id not in sim.state.workers


def test_a_new_worker_never_takes_rank_0_from_a_survivor_on_its_own_host() -> None:
    """a[0] (rank 0) dies and a[1] survives: a[1] is rank 0 of the next round, and stays
    so when a[0]'s new worker joins (rank 0 sends the committed state to the others: a
    new worker would send its fresh model instead), and no round is cut only to rank the
    same workers again."""
    sim = Sim(config(np=3, min_np=2))
    sim.running({"a": 2, "b": 1})
    survivor = sim.worker_on("a", 1)
    actions = _kill(sim, A0)
    rank0 = lambda: min(sim.state.assignment, key=lambda s: sim.state.assignment[s].rank)  # noqa: E731
    assert rank0() == A1
    [refill] = [s.worker for s in of(ev.Spawn, actions)]
    sim.join_all(last_round=1)
    sim.sync_all()
    sim.send(ev.JoinAsked(refill, 0))  # checked in: the round is told
    sim.join_all(last_round=2, committed=True)
    sim.advance(0.0)
    assert sim.state.round_number == 3 and len(sim.state.assignment) == 3
    assert rank0() == A1 and sim.worker_on("a", 1) is survivor
    sim.join_all(last_round=2)
    sim.sync_all()  # every member holds the state now: nothing to rank again
    assert of(ev.PostNotice, sim.log)[-1].seq == 1 and sim.state.growth.target is None
