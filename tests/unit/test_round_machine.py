"""The round machine as tables: state, event -> actions (no processes, no server, no clock).

Each test names the path it covers; the races that timing constants papered over in the
old driver are explicit timers here, and are tested as such.
"""

from __future__ import annotations

import pytest

from elasticrun.driver.rounds import events as ev
from elasticrun.driver.rounds.assignment import SlotId
from elasticrun.driver.rounds.cutting import STORM_LIMIT, SYNC_REPORT_WAIT_S
from elasticrun.driver.rounds.joins import REJOIN_SLACK_S, UNEXPLAINED_RESET_WAIT_S
from elasticrun.driver.rounds.state import JobPhase, WorkerStatus
from elasticrun.driver.rounds.step import FAILURE_COLLECTION_S, VACATE_WAIT_S
from elasticrun.protocol import HostUpdateResult
from tests.unit.machine_sim import Sim, answers, config, of, reports

TWO_HOSTS = {"a": 2, "b": 2}


# --- starting -------------------------------------------------------------------------------
def test_start_with_enough_hosts_opens_round_one_and_spawns_every_slot() -> None:
    sim = Sim()
    actions = sim.send(ev.JobStarted(TWO_HOSTS))
    assert of(ev.OpenRound, actions) == [ev.OpenRound(1, sim.state.assignment, 4)]
    assert sorted(s.slot.host for s in of(ev.Spawn, actions)) == ["a", "a", "b", "b"]
    assert sim.state.phase is JobPhase.RUNNING


@pytest.mark.parametrize("hosts, waited, expected", [
    ({"a": 4}, False, "opens"),
    ({"a": 1}, False, "fails"),           # static hosts: -np 4 cannot be met
    ({"a": 2}, False, "fails"),           # not elastic below -np without waiting? min_np 2
])
def test_start_refusal_for_static_hosts(hosts: dict[str, int], waited: bool,
                                        expected: str) -> None:
    sim = Sim(config(min_np=4))
    actions = sim.send(ev.JobStarted(hosts))
    assert (of(ev.OpenRound, actions) != []) == (expected == "opens")
    assert (of(ev.Fail, actions) != []) == (expected == "fails")


def test_dynamic_hosts_wait_for_np_then_start_with_min_np_at_the_start_deadline() -> None:
    sim = Sim(config(discovery_script="hosts.sh"))  # type: ignore[arg-type]
    assert of(ev.OpenRound, sim.send(ev.JobStarted({"a": 2}))) == []
    assert sim.state.phase is JobPhase.STARTING
    assert of(ev.OpenRound, sim.send(ev.HostsFound({"a": 3}))) == []
    opened = of(ev.OpenRound, sim.advance(30.0))
    assert [o.number for o in opened] == [1] and len(opened[0].assignment) == 3


def last_call_sim() -> Sim:
    """torchrun's --nnodes 1:2 --nproc-per-node 4: MIN nodes' slots, then a last call."""
    return Sim(config(np=4, min_np=4, max_np=8, discovery="hosts.sh", start_timeout=600.0,
                      last_call=2.0))


def test_the_last_call_starts_at_once_when_max_nodes_joined() -> None:
    sim = last_call_sim()
    assert of(ev.OpenRound, sim.send(ev.JobStarted({"a": 4}))) == []  # MIN: the last call
    assert of(ev.OpenRound, sim.advance(1.0)) == []
    opened = of(ev.OpenRound, sim.send(ev.HostsFound({"a": 4, "b": 4})))
    assert [len(o.assignment) for o in opened] == [8]


def test_the_last_call_ends_with_the_nodes_that_joined() -> None:
    sim = last_call_sim()
    assert of(ev.OpenRound, sim.send(ev.JobStarted({"a": 4}))) == []
    opened = of(ev.OpenRound, sim.advance(2.0))
    assert [len(o.assignment) for o in opened] == [4]


def test_no_last_call_before_min_nodes() -> None:
    sim = last_call_sim()
    assert of(ev.OpenRound, sim.send(ev.JobStarted({}))) == []
    assert of(ev.OpenRound, sim.advance(100.0)) == []  # join_timeout (600 s) still runs
    assert sim.state.phase is JobPhase.STARTING


# --- a worker fails -------------------------------------------------------------------------
def test_a_failure_breaks_the_round_and_cuts_at_once_leaving_its_host_alone() -> None:
    """The survivors meet --min-np (2) without it: they go on at once, and the slot's new
    worker starts while they train, to join at a commit."""
    sim = Sim()
    sim.running(TWO_HOSTS)
    victim = sim.worker_on("b", 1)
    neighbour = sim.worker_on("b", 0)
    actions = sim.send(ev.WorkerExited(victim.id, -9))
    assert of(ev.RecordFailure, actions)[0].cause == "rank 3 on host b was killed by SIGKILL"
    assert of(ev.BreakRound, actions) == [ev.BreakRound(1)]
    assert of(ev.StopWorkers, actions) == []  # its neighbour on b goes on
    assert reports(actions) == ["round_broken"]  # nothing blacklisted
    assert sim.state.phase is JobPhase.RECOVERING
    assert FAILURE_COLLECTION_S == 0.0  # no waiting for more failures
    actions = sim.advance(FAILURE_COLLECTION_S)
    opened = of(ev.OpenRound, actions)
    assert [(o.number, len(o.assignment), o.new_workers) for o in opened] == [(2, 3, 0)]
    assert SlotId("b", 0) in opened[0].assignment and neighbour.alive
    [refill] = of(ev.Spawn, actions)
    assert refill.slot == SlotId("b", 1) and refill.standby and refill.round == 3
    # Once it has called er.init(), the round is told to make room at its next commit.
    sim.started(actions)
    assert of(ev.PostNotice, sim.send(ev.JoinAsked(refill.worker, 0))) == [
        ev.PostNotice(1, HostUpdateResult.added)]
    sim.join_all(last_round=1)
    sim.join_all(last_round=2, committed=True)
    opened = of(ev.OpenRound, sim.advance(0.0))
    assert [(o.number, len(o.assignment), o.new_workers) for o in opened] == [(3, 4, 0)]
    assert sim.state.round is not None and sim.state.round.members[SlotId("b", 0)] == \
        neighbour.id


def test_with_min_np_at_np_the_survivors_wait_for_the_slots_new_worker() -> None:
    sim = Sim(config(min_np=4))
    sim.running(TWO_HOSTS)
    survivors = {w.id for w in sim.members()} - {sim.worker_on("a", 1).id}
    sim.send(ev.WorkerExited(sim.worker_on("a", 1).id, 1))
    actions = sim.advance(0.0)
    [opened] = of(ev.OpenRound, actions)
    assert (opened.number, len(opened.assignment), opened.new_workers) == (2, 4, 1)
    [refill] = of(ev.Spawn, actions)
    assert refill.slot == SlotId("a", 1) and not refill.standby
    assert of(ev.StopWorkers, sim.log) == []
    assert survivors <= {w.id for w in sim.members()}  # the same processes
    assert opened.assignment[SlotId("a", 1)].local_rank == 1  # the slot's own local rank


def test_a_refill_waits_for_its_slots_failed_worker_to_exit() -> None:
    """A worker that raised is left to print its error and exit: its slot's new worker
    starts once it is gone (never two processes on one GPU), or it is killed after
    VACATE_WAIT_S."""
    sim = Sim(config(min_np=4))
    sim.running(TWO_HOSTS)
    failing = sim.worker_on("a", 1)
    sim.send(ev.WorkerFailing(failing.id, "ValueError: bad batch"))
    actions = sim.advance(0.0)
    assert of(ev.OpenRound, actions)[0].new_workers == 1 and of(ev.Spawn, actions) == []
    [spawn] = of(ev.Spawn, sim.send(ev.WorkerExited(failing.id, 1)))
    assert spawn.slot == SlotId("a", 1) and not spawn.standby
    # Another one that does not exit is killed at the bound.
    stuck = sim.worker_on("b", 0)
    sim.send(ev.WorkerFailing(stuck.id, "ValueError: bad batch"))
    sim.advance(0.0)
    assert of(ev.StopWorkers, sim.advance(VACATE_WAIT_S - 0.1)) == []
    assert of(ev.StopWorkers, sim.advance(0.1)) == [ev.StopWorkers((stuck.id,), kill=True)]
    assert [s.slot for s in of(ev.Spawn, sim.send(ev.WorkerExited(stuck.id, -9)))] == [
        SlotId("b", 0)]


def test_failure_during_rendezvous_breaks_the_forming_round() -> None:
    sim = Sim(config(host_snapshots=False))
    sim.running(TWO_HOSTS)
    sim.send(ev.WorkerExited(sim.worker_on("b", 0).id, 1))
    sim.advance(1.0)  # round 2 open, nobody joined yet
    assert sim.state.round_number == 2
    sim.send(ev.JoinAsked(sim.worker_on("a", 0).id, 1))
    actions = sim.send(ev.WorkerExited(sim.worker_on("a", 1).id, 1))
    assert of(ev.BreakRound, actions) == [ev.BreakRound(2)]
    actions = sim.advance(1.0)
    [opened] = of(ev.OpenRound, actions)  # the two that hold the state go on
    assert opened.number == 3 and set(opened.assignment) == {SlotId("a", 0), SlotId("b", 1)}
    # a[1] gets a new worker; b[0]'s, still starting, waits for a later round
    assert [s.slot for s in of(ev.Spawn, actions)] == [SlotId("a", 1)]
    assert sim.worker_on("b", 0).standby and sim.worker_on("b", 0).id in sim.state.growth.ids


def test_failure_during_sync_keeps_the_holders_that_reported() -> None:
    """Round 2 adds host c; b dies before c reports its sync: c's fresh worker must not
    become rank 0 of round 3."""
    sim = Sim(config(np=2, max_np=6))
    sim.running({"a": 1, "b": 1})
    sim.send(ev.HostsFound({"a": 1, "b": 1, "c": 1}))
    for spawn in of(ev.Spawn, sim.log):
        sim.send(ev.WorkerStarted(spawn.worker))
    # a dies; b survives and holds the state; c is new and has not synced.
    sim.send(ev.WorkerExited(sim.worker_on("a").id, 1))
    sim.advance(1.0)
    assert sim.state.round_number == 2
    rank0 = min(sim.state.assignment.items(), key=lambda item: item[1].rank)[0]
    assert rank0.host == "b"


def test_a_worker_exit_0_finishes_the_job_when_every_member_has() -> None:
    sim = Sim()
    sim.running(TWO_HOSTS)
    members = sim.members()
    for worker in members[:-1]:
        assert of(ev.Finish, sim.send(ev.WorkerExited(worker.id, 0))) == []
    assert sim.state.phase is JobPhase.FINISHING
    assert of(ev.Finish, sim.send(ev.WorkerExited(members[-1].id, 0))) == [ev.Finish(0)]


def test_a_failure_after_others_finished_fails_the_job() -> None:
    sim = Sim()
    sim.running(TWO_HOSTS)
    members = sim.members()
    sim.send(ev.WorkerExited(members[0].id, 0))
    fail = of(ev.Fail, sim.send(ev.WorkerExited(members[1].id, 3)))
    assert fail and "after other workers had finished" in fail[0].message


# --- resets asked by workers ---------------------------------------------------------------
def test_unexplained_reset_waits_for_the_exit_that_explains_it() -> None:
    sim = Sim()
    sim.running(TWO_HOSTS)
    asker = sim.worker_on("a", 0)
    sim.send(ev.JoinAsked(asker.id, 1, "WorkersFailedError: connection reset", True))
    assert sim.state.cut_at == sim.now + UNEXPLAINED_RESET_WAIT_S
    # The exit arrives within the wait: the cut happens (once) without the failed worker.
    sim.advance(0.1)
    sim.send(ev.WorkerExited(sim.worker_on("b", 0).id, -9))
    opened = of(ev.OpenRound, sim.advance(1.0))
    assert len(opened) == 1 and SlotId("b", 0) not in opened[0].assignment
    assert len(opened[0].assignment) == 3


def test_reset_asked_by_every_member_cuts_at_once() -> None:
    sim = Sim()
    sim.running(TWO_HOSTS)
    actions = sim.join_all(last_round=1, failure="WorkersFailedError: x", committed=True)
    assert [t.timer.kind for t in of(ev.SetTimer, actions)][-1] is ev.TimerKind.CUT_ROUND
    assert sim.state.cut_at == sim.now
    assert of(ev.OpenRound, sim.advance(0.0))[0].number == 2


def test_notice_during_reset_cuts_at_once_and_is_reflected_by_the_new_round() -> None:
    sim = Sim(config(np=2, max_np=4))
    sim.running({"a": 2})
    sim.started(sim.send(ev.HostsFound({"a": 2, "b": 2})))
    standbys = list(sim.state.growth.ids)
    for worker in standbys:
        sim.send(ev.JoinAsked(worker, 0))
    assert of(ev.PostNotice, sim.log) == [ev.PostNotice(1, HostUpdateResult.added)]
    sim.send(ev.JoinAsked(sim.worker_on("a", 0).id, 1))  # its commit saw the notice
    assert sim.state.cut_at == sim.now  # a host change was announced: expected
    opened = of(ev.OpenRound, sim.advance(0.0))
    assert opened[0].new_workers == 0 and len(opened[0].assignment) == 4
    assert sim.state.round is not None and sim.state.round.notice_seq == 1


def test_host_added_during_a_reset_is_taken_by_the_cut() -> None:
    sim = Sim(config(np=2, max_np=4))
    sim.running({"a": 1, "b": 1})
    sim.send(ev.WorkerExited(sim.worker_on("b").id, 1))
    assert sim.state.phase is JobPhase.RECOVERING
    # Growth is not planned while a round is being cut: the cut takes the hosts as they are.
    assert of(ev.Spawn, sim.send(ev.HostsFound({"a": 1, "b": 1, "c": 2}))) == []
    opened = of(ev.OpenRound, sim.advance(1.0))
    # a alone is short of --min-np 2: the round takes b's refill and c's new workers at once
    assert sorted(s.host for s in opened[0].assignment) == ["a", "b", "c", "c"]
    assert opened[0].new_workers == 3


# --- joining -------------------------------------------------------------------------------
def test_a_round_completes_when_every_member_joined_and_all_are_answered_run() -> None:
    sim = Sim()
    sim.start(TWO_HOSTS)
    members = sim.members()
    for worker in members[:-1]:
        assert answers(sim.send(ev.JoinAsked(worker.id, 0))) == {}
    last = sim.send(ev.JoinAsked(members[-1].id, 0))
    assert answers(last) == {w.id: "run" for w in members}
    assert "round_completed" in reports(last)
    kinds = [t.timer.kind for t in of(ev.SetTimer, sim.log)]
    # Survivors rejoin within the collective timeout (10 s) + slack, sooner than the start.
    assert ev.TimerKind.CHECK_IN in kinds and ev.TimerKind.REJOIN in kinds


def test_a_member_that_never_calls_init_is_failed_at_the_init_timeout() -> None:
    """Its set-up before er.init() (imports, data, model) may take minutes: the check-in of
    a member that never joined before is --init-timeout after the round's first join."""
    sim = Sim(config(init_timeout=600.0))
    sim.start(TWO_HOSTS)
    for worker in sim.members()[:-1]:
        sim.send(ev.JoinAsked(worker.id, 0))
    assert not of(ev.RecordFailure, sim.advance(599.0))  # --start-timeout (30 s) is moot
    failure = of(ev.RecordFailure, sim.advance(1.0))
    assert failure and failure[0].kind == "check_in_timeout" and failure[0].host == "b"
    assert "did not call er.init() for round 1 within 600s of its round's first join " \
           "(--init-timeout)" in failure[0].cause


def test_a_round_that_no_member_ever_joins_runs_as_long_as_it_runs() -> None:
    """Scripts that never call er.init() (torchrun-style), or whose set-up before it is slow:
    no bound ends them, whatever the driver's timers."""
    sim = Sim(config(init_timeout=60.0))
    sim.start(TWO_HOSTS)
    actions = sim.advance(10 * 3600.0)
    assert not of(ev.RecordFailure, actions) and not of(ev.Fail, actions)
    assert sim.state.phase is JobPhase.RUNNING and all(w.alive for w in sim.members())


def test_running_members_that_never_rejoin_are_failed_at_the_backstop() -> None:
    """Every member that ran before held elsewhere (the chaos soak: all in the last round's
    Gloo connect, which an abort cannot end): no join starts the check-in deadlines, so the
    opening's backstop (start timeout + collective timeout + slack) bounds the wait."""
    sim = Sim()
    sim.running(TWO_HOSTS)
    sim.send(ev.WorkerExited(sim.worker_on("b", 1).id, 1))
    sim.advance(FAILURE_COLLECTION_S)
    assert sim.state.round_number == 2
    bound = 30.0 + 10.0 + REJOIN_SLACK_S
    assert not of(ev.RecordFailure, sim.advance(bound - 1.0))
    failures = of(ev.RecordFailure, sim.advance(1.0))
    assert sorted(f.host for f in failures) == ["a", "a", "b"]  # each of them, alone
    assert f"did not join round 2 within {bound:g}s of its opening" in failures[0].cause


def test_the_backstop_leaves_a_round_whose_members_join_to_its_check_in() -> None:
    sim = Sim(config(start_timeout=60.0, collective_timeout=5.0, np=2, min_np=2))
    sim.running({"a": 1, "b": 1})
    sim.send(ev.WorkerExited(sim.worker_on("b").id, 1))
    sim.send(ev.HostsFound({"a": 1, "c": 1}))  # a new host: round 2 has a new member
    sim.advance(0.0)
    assert sorted(s.host for s in sim.state.assignment) == ["a", "c"]
    sim.advance(20.0)
    sim.send(ev.JoinAsked(sim.worker_on("a").id, 1))
    assert not of(ev.RecordFailure, sim.advance(60.0))  # past the backstop: it is moot
    failure = of(ev.RecordFailure, sim.advance(config().init_timeout))
    assert [f.host for f in failure] == ["c"] and "--init-timeout" in failure[0].cause


def test_a_stuck_survivor_is_failed_at_the_rejoin_bound_not_the_start_timeout() -> None:
    sim = Sim(config(start_timeout=60.0, collective_timeout=5.0))
    sim.running(TWO_HOSTS)
    stuck = sim.worker_on("b", 1)
    for worker in sim.members():
        if worker.id != stuck.id:
            sim.send(ev.JoinAsked(worker.id, 1, "WorkersFailedError: timed out"))
    sim.advance(1.0)  # round 2 opened; the others join it at once
    for worker in sim.members():
        if worker.id != stuck.id:
            sim.send(ev.JoinAsked(worker.id, 1))
    actions = sim.advance(5.0 + REJOIN_SLACK_S)
    assert [f.host for f in of(ev.RecordFailure, actions)] == ["b"]
    assert "within 10s" in of(ev.RecordFailure, actions)[0].cause


def test_a_leaving_worker_is_held_until_the_new_round_settles() -> None:
    sim = Sim(config(np=2, min_np=1))
    sim.running({"a": 1, "b": 1})
    leaving = sim.worker_on("b")
    sim.send(ev.HostsDrained(("b",)))
    sim.join_all(last_round=1, committed=True)
    sim.advance(0.0)
    assert answers(sim.send(ev.JoinAsked(leaving.id, 1))) == {}  # held: last holder?
    sim.join_all(last_round=1)
    assert answers(sim.sync_all()) == {leaving.id: "exit"}
    assert leaving.status is WorkerStatus.RELEASED


def test_a_held_leaving_worker_is_released_when_the_hold_ends() -> None:
    sim = Sim(config(np=2, min_np=1, start_timeout=5.0, collective_timeout=5.0))
    sim.running({"a": 1, "b": 1})
    leaving = sim.worker_on("b")
    sim.send(ev.HostsDrained(("b",)))
    sim.join_all(last_round=1, committed=True)
    sim.advance(0.0)
    sim.send(ev.JoinAsked(leaving.id, 1))
    assert answers(sim.advance(10.0)) == {leaving.id: "exit"}


# --- growth --------------------------------------------------------------------------------
def test_new_hosts_start_standbys_and_notify_only_when_all_checked_in() -> None:
    sim = Sim(config(np=2, max_np=4))
    sim.running({"a": 2})
    actions = sim.send(ev.HostsFound({"a": 2, "b": 2}))
    spawns = of(ev.Spawn, actions)
    assert [s.standby for s in spawns] == [True, True]
    sim.started(actions)
    sim.send(ev.JoinAsked(spawns[0].worker, 0))
    assert of(ev.PostNotice, sim.log) == []
    assert of(ev.PostNotice, sim.send(ev.JoinAsked(spawns[1].worker, 0))) == [
        ev.PostNotice(1, HostUpdateResult.added)]


@pytest.mark.parametrize("late", [0, 1, 2, 3])
def test_an_unchanged_poll_while_syncs_are_reported_notifies_nobody(late: int) -> None:
    """Round 1's members report their syncs one by one; a discovery poll (unchanged) lands
    while one report is still on its way. The holders-first order of the round the hosts give
    differs from round 1's for that moment, but the slots are the same: no notice, no new
    round. (CI saw the job re-form its first round at its first commit.)"""
    sim = Sim(config(np=4, min_np=2))
    sim.start({"a": 2, "b": 2})
    sim.join_all()
    members = sorted(sim.members(), key=lambda w: w.rank)
    for worker in members[:late] + members[late + 1:]:
        sim.send(ev.WorkerSynced(worker.id, 1))
    actions = sim.send(ev.HostsFound({"a": 2, "b": 2}))
    assert of(ev.PostNotice, actions) == [] and of(ev.Spawn, actions) == []
    sim.send(ev.WorkerSynced(members[late].id, 1))
    assert of(ev.PostNotice, sim.log) == []


def test_a_standby_that_never_checks_in_fails_at_the_init_timeout() -> None:
    sim = Sim(config(np=2, max_np=4, init_timeout=300.0))
    sim.running({"a": 2})
    sim.started(sim.send(ev.HostsFound({"a": 2, "b": 2})))
    assert not of(ev.RecordFailure, sim.advance(299.0))
    actions = sim.advance(1.0)
    assert [f.host for f in of(ev.RecordFailure, actions)] == ["b", "b"]
    assert "did not call er.init() within 300s (--init-timeout)" in \
        of(ev.RecordFailure, actions)[0].cause
    assert of(ev.BreakRound, actions) == []  # the running round was not on b
    stopped = [w for s in of(ev.StopWorkers, actions) for w in s.workers]
    assert len(stopped) == 2
    # Once gone, each slot gets a new standby.
    respawned = [s.slot for w in stopped for s in of(ev.Spawn, sim.send(ev.WorkerExited(w, -9)))]
    assert sorted(respawned) == [SlotId("b", 0), SlotId("b", 1)]


def test_drain_makes_the_round_leave_at_the_next_commit() -> None:
    sim = Sim(config(np=2, min_np=1))
    sim.running({"a": 1, "b": 1})
    actions = sim.send(ev.HostsDrained(("b",)))
    assert reports(actions) == ["host_drained"]
    # Nothing to start: notify now.
    assert of(ev.PostNotice, actions) == [ev.PostNotice(1, HostUpdateResult.removed)]


# --- capacity, cooldown, limits ------------------------------------------------------------
def test_elastic_timeout_when_below_min_np_for_too_long() -> None:
    sim = Sim(config(discovery_script="hosts.sh", np=2, min_np=2))  # type: ignore[arg-type]
    sim.running({"a": 1, "b": 1})
    sim.send(ev.HostsFound({"a": 1, "b": 1}))
    sim.send(ev.WorkerExited(sim.worker_on("b").id, 1))
    sim.send(ev.HostsFound({"a": 1}))  # and b is gone
    sim.advance(1.0)
    assert sim.state.capacity_deadline is not None
    fail = of(ev.Fail, sim.advance(60.0))
    assert fail and fail[0].message.startswith("elastic timeout")


# --- discovery lists fewer than --min-np slots (Horovod Elastic's rule) ----------------------
def _below_min_np(found: dict[str, int], min_np: int = 2) -> tuple[Sim, list[ev.Action]]:
    """Round 1 on a and b (one slot each); then discovery lists only `found`."""
    sim = Sim(config(discovery_script="h", np=2, min_np=min_np,  # type: ignore[arg-type]
                     elastic_timeout=60.0))
    sim.running({"a": 1, "b": 1})
    return sim, sim.send(ev.HostsFound(found))


@pytest.mark.parametrize(("found", "slots"), [({"a": 1}, 1), ({}, 0), ({"c": 1}, 1)])
def test_hosts_below_min_np_notify_the_round_at_once(found: dict[str, int], slots: int) -> None:
    """Discovery is the truth: the round is told (no standbys to wait for) and stops at its
    next commit; the warning counts the slots discovery lists, not a kept worker's."""
    sim, actions = _below_min_np(found)
    assert of(ev.PostNotice, actions) == [ev.PostNotice(1, HostUpdateResult.removed)]
    assert of(ev.Spawn, actions) == []  # nothing starts for a round that cannot be formed
    [warning] = [a.message for a in of(ev.Log, actions) if a.level == "warning"]
    assert f"{slots} slot(s) available, fewer than --min-np 2" in warning
    assert "waits up to 60s (--elastic-timeout)" in warning
    assert of(ev.PostNotice, sim.send(ev.HostsFound(found))) == []  # told once


def test_below_min_np_the_next_round_waits_then_fails_naming_the_wait() -> None:
    sim, _ = _below_min_np({"a": 1})
    members = [w.id for w in sim.members()]
    actions = sim.join_all(last_round=1, committed=True)  # their commit saw the notice
    actions += sim.advance(0.0)
    assert of(ev.OpenRound, actions) == [] and of(ev.StopWorkers, actions) == []
    assert sim.state.phase is JobPhase.RECOVERING and sim.state.capacity_deadline is not None
    assert all(sim.state.workers[w].alive for w in members)  # b's worker still holds state
    assert of(ev.Fail, sim.advance(59.0)) == []
    [fail] = of(ev.Fail, sim.advance(1.0))
    assert fail.message == ("elastic timeout: waited 60s (--elastic-timeout) for --min-np 2 "
                            "slot(s), but only 1 are available (hosts: a:1)")


def test_below_min_np_a_host_that_comes_back_in_the_wait_is_used() -> None:
    sim, _ = _below_min_np({})
    before = {w.slot: w.id for w in sim.members()}
    sim.join_all(last_round=1, committed=True)
    sim.advance(30.0)
    actions = sim.send(ev.HostsFound({"a": 1, "b": 1}))
    [opened] = of(ev.OpenRound, actions)
    assert opened.number == 2 and opened.new_workers == 0  # the same workers, state kept
    assert sim.state.round is not None and sim.state.round.members == before
    assert set(answers(actions).values()) == {"run"}


def test_below_min_np_a_new_host_completes_the_round_and_the_gone_host_leaves() -> None:
    sim, _ = _below_min_np({"a": 1})
    gone = sim.worker_on("b")
    sim.join_all(last_round=1, committed=True)
    sim.advance(1.0)
    actions = sim.send(ev.HostsFound({"a": 1, "c": 1}))
    [opened] = of(ev.OpenRound, actions)
    assert sorted(s.host for s in opened.assignment) == ["a", "c"] and opened.new_workers == 1
    assert opened.assignment[SlotId("a", 0)].rank == 0  # the state's holder stays rank 0
    sim.started(actions)
    sim.join_all(last_round=1)
    sim.sync_all()
    assert answers(sim.log)[gone.id] == "exit"


def test_below_min_np_with_min_np_1_no_round_opens_on_a_gone_host() -> None:
    """With every host gone, the worker that holds the state is not a round of one."""
    sim, _ = _below_min_np({}, min_np=1)
    sim.join_all(last_round=1, committed=True)
    assert of(ev.OpenRound, sim.advance(1.0)) == []
    assert sim.state.capacity_deadline is not None


def test_cooldown_return_ends_the_wait_for_capacity() -> None:
    sim = Sim(config(np=2, min_np=2, blacklist_cooldown=(2.0, 2.0)))
    sim.running({"a": 1, "b": 1})
    sim.send(ev.WorkerExited(sim.worker_on("b").id, 1, host_lost=True))  # its agent is gone
    assert of(ev.OpenRound, sim.advance(1.0)) == []  # waiting for b to come back
    actions = sim.advance(2.0)
    assert "host_restored" in reports(actions)
    opened = of(ev.OpenRound, actions)
    assert opened and opened[0].new_workers == 1


def test_reset_limit() -> None:
    sim = Sim(config(reset_limit=0))
    sim.running(TWO_HOSTS)
    sim.send(ev.WorkerExited(sim.worker_on("b").id, 1))
    fail = of(ev.Fail, sim.advance(1.0))
    assert fail and fail[0].message == "reset limit 0 reached: another reset was needed"


def _holders_lost_before_the_new_one_reported(host_snapshots: bool = True) -> Sim:
    """Round 2 adds host c (complete; nobody reported a sync for it yet); then a and b, the
    only workers known to hold the committed state, die."""
    sim = Sim(config(np=2, min_np=1, max_np=4, discovery_script="h",  # type: ignore[arg-type]
                     host_snapshots=host_snapshots))
    sim.running({"a": 1, "b": 1})
    sim.started(sim.send(ev.HostsFound({"a": 1, "b": 1, "c": 1})))
    for standby in list(sim.state.growth.ids):
        sim.send(ev.JoinAsked(standby, 0))
    sim.join_all(last_round=1, committed=True)
    sim.advance(0.0)
    sim.join_all(last_round=1)
    sim.send(ev.WorkerExited(sim.worker_on("a").id, 1))
    sim.send(ev.WorkerExited(sim.worker_on("b").id, 1))
    return sim


def test_state_lost_waits_for_reports_and_is_saved_by_one() -> None:
    sim = _holders_lost_before_the_new_one_reported()
    sim.advance(1.0)
    assert sim.state.sync_grace_until is not None  # c may hold it: its report may be late
    actions = sim.send(ev.WorkerSynced(sim.worker_on("c").id, 2))
    assert [o.number for o in of(ev.OpenRound, actions)] == [3]


def test_state_lost_for_good_stops_the_job_after_the_report_wait() -> None:
    """Nothing keeps the state outside the workers (with host snapshots: test_total_loss.py)."""
    sim = _holders_lost_before_the_new_one_reported(host_snapshots=False)
    assert of(ev.Fail, sim.advance(1.0)) == []
    fail = of(ev.Fail, sim.advance(SYNC_REPORT_WAIT_S))
    assert fail and "no worker holding the committed training state" in fail[0].message


def test_a_reset_storm_stops_the_job_naming_the_rank_that_keeps_failing() -> None:
    sim = Sim()
    sim.running(TWO_HOSTS)
    culprit = sim.worker_on("a", 1)
    for _ in range(STORM_LIMIT):
        number = sim.state.round_number
        sim.send(ev.JoinAsked(culprit.id, number, "WorkersFailedError: shape mismatch"))
        for worker in sim.members():
            sim.send(ev.JoinAsked(worker.id, number, "WorkersFailedError: reset by peer"))
        sim.advance(0.0)
        if sim.state.phase is JobPhase.STOPPED:
            break
        sim.join_all(last_round=number)
    fail = of(ev.Fail, sim.log)
    assert fail and "rank 1 on host a keeps failing: WorkersFailedError: shape mismatch" \
        in fail[0].message
    assert sim.state.round_number == STORM_LIMIT


def test_a_commit_between_failures_is_progress_not_a_storm() -> None:
    sim = Sim()
    sim.running(TWO_HOSTS)
    for _ in range(STORM_LIMIT + 2):
        number = sim.state.round_number
        sim.join_all(last_round=number, failure="WorkersFailedError: flaky link",
                     committed=True)
        sim.advance(0.0)
        sim.join_all(last_round=number)
    assert of(ev.Fail, sim.log) == [] and sim.state.round_number == STORM_LIMIT + 3


def test_interrupt_stops_and_nothing_is_decided_after() -> None:
    sim = Sim()
    sim.running(TWO_HOSTS)
    assert of(ev.Finish, sim.send(ev.Interrupted("SIGTERM", 143))) == [ev.Finish(143)]
    assert sim.send(ev.WorkerExited(sim.worker_on("a").id, -15)) == []


def test_spawn_failure_fails_the_host() -> None:
    sim = Sim()
    actions = sim.send(ev.JobStarted(TWO_HOSTS))
    b0 = next(s for s in of(ev.Spawn, actions) if s.slot.host == "b")
    out = sim.send(ev.SpawnFailed(b0.worker, "ssh: connection refused"))
    assert of(ev.RecordFailure, out)[0].kind == "spawn_error"
    assert "host_blacklisted" in reports(out)


def test_a_worker_started_after_its_host_failed_is_stopped() -> None:
    sim = Sim()
    actions = sim.send(ev.JobStarted(TWO_HOSTS))
    b = [s.worker for s in of(ev.Spawn, actions) if s.slot.host == "b"]
    sim.send(ev.SpawnFailed(b[0], "boom"))
    assert of(ev.StopWorkers, sim.send(ev.WorkerStarted(b[1]))) == [ev.StopWorkers((b[1],))]


def test_a_workers_own_error_breaks_its_round_at_once_and_is_not_stopped() -> None:
    sim = Sim()
    sim.running(TWO_HOSTS)
    failing = sim.worker_on("b", 1)
    actions = sim.send(ev.WorkerFailing(failing.id, "RuntimeError: shard 17 timed out"))
    failure = of(ev.RecordFailure, actions)
    assert [(f.kind, f.cause) for f in failure] == [
        ("exception", "rank 3 on host b failed: RuntimeError: shard 17 timed out")]
    assert of(ev.BreakRound, actions) == [ev.BreakRound(1)]
    # No worker is stopped: its neighbour goes on, it is left to print its error.
    assert of(ev.StopWorkers, actions) == []
    # Its exit later is not a second failure.
    assert of(ev.RecordFailure, sim.send(ev.WorkerExited(failing.id, 1))) == []
    opened = of(ev.OpenRound, sim.advance(1.0))
    assert [(o.number, len(o.assignment)) for o in opened] == [(2, 3)]


def test_a_workers_own_error_after_others_finished_fails_the_job() -> None:
    sim = Sim()
    sim.running(TWO_HOSTS)
    members = sim.members()
    sim.send(ev.WorkerExited(members[0].id, 0))
    fail = of(ev.Fail, sim.send(ev.WorkerFailing(members[1].id, "ValueError: bad batch")))
    assert fail and "failed: ValueError: bad batch after other workers had finished" \
        in fail[0].message
