"""A total loss through the round machine (total_loss.py): when no live worker holds the
committed state, the next round starts new workers told to restore the kept commit; with
nothing kept, or no restart left, the job stops naming the failure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from elasticrun.driver.rounds import events as ev
from elasticrun.driver.rounds.cutting import SYNC_REPORT_WAIT_S
from elasticrun.driver.rounds.state import JobPhase, WorkerStatus
from elasticrun.driver.rounds.step import FAILURE_COLLECTION_S
from tests.unit.machine_sim import Sim, config, of, reports

ONE_HOST = {"a": 2}


def _one_host(**overrides: Any) -> Sim:
    sim = Sim(config(np=2, min_np=1, **overrides))
    sim.running(ONE_HOST)
    return sim


def _all_exit(sim: Sim, code: int = 1) -> list[ev.Action]:
    """Every member of the round exits; the first one's failure stops the others, whose
    exits come before the cut."""
    actions: list[ev.Action] = []
    for worker in sim.members():
        actions += sim.send(ev.WorkerExited(worker.id, code))
    return actions


def _total_loss(actions: list[ev.Action]) -> list[ev.Report]:
    return [r for r in of(ev.Report, actions) if r.name == "total_loss"]


def test_a_round_that_loses_every_worker_restarts_with_new_workers_told_to_restore() -> None:
    sim = _one_host()
    before = {w.id for w in sim.members()}
    failed = _all_exit(sim)
    assert [f.host for f in of(ev.RecordFailure, failed)] == ["a", "a"]
    assert not sim.state.hosts.holds_out("a", sim.now)  # one failure each: nobody to blame
    actions = sim.advance(FAILURE_COLLECTION_S)
    [opened] = of(ev.OpenRound, actions)
    assert (opened.number, len(opened.assignment), opened.new_workers) == (2, 2, 2)
    spawns = of(ev.Spawn, actions)
    assert sorted(s.slot.index for s in spawns) == [0, 1]
    assert not {s.worker for s in spawns} & before
    assert all(s.restore and s.round == 2 and s.restarts == 1 and not s.standby
               for s in spawns)
    assert sim.state.restarts == 1 and sim.state.restoring
    assert sim.state.phase is JobPhase.RUNNING
    [report] = _total_loss(actions)
    assert report.fields == {"cause": "rank 0 on host a exited with code 1", "restarts": 1,
                             "hosts": []}
    [warning] = [a.message for a in of(ev.Log, actions) if a.level == "warning"]
    assert warning == ("every worker holding the committed training state was lost (first: "
                       "rank 0 on host a exited with code 1); restarting from the newest kept "
                       "commit (restart 1 of 3)")
    assert of(ev.Fail, sim.log) == []


def test_a_host_its_failures_blacklisted_is_given_back_for_the_restart() -> None:
    """a[1] fails, its new worker fails before it checks in, then a[0], the last holder:
    3 failures on 2 slots blacklist a, and the state is lost with it. Every worker lost at
    once says nothing about a host: it is given back, its count of failures kept."""
    sim = _one_host()
    sim.send(ev.WorkerExited(sim.worker_on("a", 1).id, -9))
    refills = of(ev.Spawn, sim.advance(FAILURE_COLLECTION_S))
    assert [s.slot.index for s in refills] == [1]
    sim.started(refills)
    sim.send(ev.WorkerExited(refills[0].worker, 1))
    assert not sim.state.hosts.holds_out("a", sim.now)
    stopped = of(ev.StopWorkers, sim.send(ev.WorkerExited(sim.worker_on("a", 0).id, 1)))
    assert sim.state.hosts.is_blacklisted("a", sim.now)
    for worker in stopped[0].workers:  # its next new worker, stopped with the host
        sim.send(ev.WorkerExited(worker, -15))
    actions = sim.advance(FAILURE_COLLECTION_S)
    [opened] = of(ev.OpenRound, actions)
    assert opened.new_workers == 2 and all(s.restore for s in of(ev.Spawn, actions))
    assert not sim.state.hosts.is_blacklisted("a", sim.now)
    assert sim.state.hosts.blacklist_snapshot()["a"].failures == 1
    assert _total_loss(actions)[0].fields["hosts"] == ["a"]
    assert "; hosts given back: a" in [a.message for a in of(ev.Log, actions)
                                       if a.level == "warning"][-1]


def test_with_no_worker_alive_the_round_opens_at_the_cut() -> None:
    """No worker of the job is alive: no sync report can be in flight, nothing to wait for."""
    sim = _one_host()
    _all_exit(sim)
    cut_at = sim.now
    actions = sim.advance(FAILURE_COLLECTION_S)
    assert [o.number for o in of(ev.OpenRound, actions)] == [2]
    assert sim.now == cut_at + FAILURE_COLLECTION_S
    kinds = [t.timer.kind for t in of(ev.SetTimer, actions)]
    assert ev.TimerKind.SYNC_REPORTS_DUE not in kinds
    assert sim.state.sync_grace_until is None


def test_new_workers_already_started_in_the_lost_slots_do_not_hold_the_restart() -> None:
    """Every worker dies one after another (a node's kill-all): the first deaths' slots get
    new workers, alive and starting. They never joined a round, so no sync report of theirs
    can be in flight: the restart is decided at the cut, not SYNC_REPORT_WAIT_S later."""
    sim = _one_host()
    first, second = sim.members()
    sim.send(ev.WorkerExited(first.id, -9))
    sim.started(sim.advance(FAILURE_COLLECTION_S))  # round 2 (min_np 1), and a new worker
    sim.send(ev.WorkerExited(second.id, -9))  # before round 2 was through its rendezvous
    assert any(w.alive and w.joined_round == 0 for w in sim.state.workers.values())
    cut_at = sim.now
    opened = of(ev.OpenRound, sim.advance(FAILURE_COLLECTION_S))
    assert [o.number for o in opened] == [3] and sim.now == cut_at + FAILURE_COLLECTION_S
    assert sim.state.sync_grace_until is None
    assert len(_total_loss(sim.log)) == 1


def test_with_a_worker_still_stopping_the_restart_waits_for_late_sync_reports() -> None:
    sim = Sim(config(np=2, min_np=2, shard_size=2))  # one replica group: its peer stops
    sim.running(ONE_HOST)
    first, stopping = sim.members()
    sim.send(ev.WorkerExited(first.id, 1))  # the other is being stopped, still alive
    assert stopping.status is WorkerStatus.STOPPING
    assert of(ev.OpenRound, sim.advance(FAILURE_COLLECTION_S)) == []
    assert sim.state.sync_grace_until == sim.now + SYNC_REPORT_WAIT_S
    assert _total_loss(sim.log) == []  # not decided yet
    actions = sim.advance(SYNC_REPORT_WAIT_S)
    [opened] = of(ev.OpenRound, actions)
    assert opened.new_workers == 2 and all(s.restore for s in of(ev.Spawn, actions))
    assert len(_total_loss(actions)) == 1 and stopping.alive


def test_hosts_blacklisted_before_the_lost_round_stay_blacklisted() -> None:
    """b was lost with its agent in round 1 (a held the state on), a's workers in round 2:
    b stays blacklisted."""
    sim = Sim(config(np=4, min_np=2))
    sim.running({"a": 2, "b": 2})
    stopped = sim.worker_on("b", 1)
    sim.send(ev.WorkerExited(sim.worker_on("b", 0).id, 1, host_lost=True))
    sim.advance(FAILURE_COLLECTION_S)
    assert sim.state.round_number == 2
    sim.send(ev.WorkerExited(stopped.id, -15))  # stopped with its host
    sim.join_all(last_round=1)
    sim.sync_all()
    _all_exit(sim)
    actions = sim.advance(FAILURE_COLLECTION_S)
    [opened] = of(ev.OpenRound, actions)
    assert {s.host for s in opened.assignment} == {"a"} and opened.new_workers == 2
    assert sim.state.hosts.is_blacklisted("b", sim.now)
    assert _total_loss(actions)[0].fields["hosts"] == []


def test_no_restart_left_fails_naming_the_first_failure() -> None:
    sim = _one_host(max_restarts=0)
    _all_exit(sim, code=3)
    actions = sim.advance(FAILURE_COLLECTION_S)
    [fail] = of(ev.Fail, actions)
    assert fail.message == ("every worker holding the committed training state was lost, and "
                            "no restart is left (--max-restarts 0); first failure: rank 0 on "
                            "host a exited with code 3")
    assert of(ev.OpenRound, actions) == [] and sim.state.restarts == 0
    assert sim.state.phase is JobPhase.STOPPED


def _restarted_round_runs(sim: Sim, restored: tuple[int, str] = (5, "host a")) -> None:
    """The restarted round's new workers start, join and sync; rank 0 restored."""
    sim.started(of(ev.Spawn, sim.log))
    sim.join_all()
    members = sim.members()
    sim.send(ev.WorkerSynced(members[0].id, sim.state.round_number, restored))
    for worker in members[1:]:
        sim.send(ev.WorkerSynced(worker.id, sim.state.round_number))


def test_a_failure_that_repeats_after_every_restart_ends_the_job() -> None:
    sim = _one_host(max_restarts=2)
    for restart in (1, 2):
        _all_exit(sim)
        sim.advance(FAILURE_COLLECTION_S)
        assert sim.state.restarts == restart and sim.state.round_number == restart + 1
        _restarted_round_runs(sim)
    _all_exit(sim, code=7)
    [fail] = of(ev.Fail, sim.advance(FAILURE_COLLECTION_S))
    assert "(--max-restarts 2); first failure: rank 0 on host a exited with code 7" \
        in fail.message
    assert len(_total_loss(sim.log)) == 2


@pytest.mark.parametrize(("host_snapshots", "checkpoint_dir", "restarts"), [
    (True, None, True),
    (False, Path("/ckpt"), True),
    (True, Path("/ckpt"), True),
    (False, None, False),
])
def test_a_restart_needs_something_that_keeps_the_commit(
        host_snapshots: bool, checkpoint_dir: Path | None, restarts: bool) -> None:
    sim = _one_host(host_snapshots=host_snapshots, checkpoint_dir=checkpoint_dir)
    _all_exit(sim)
    actions = sim.advance(FAILURE_COLLECTION_S)
    assert (of(ev.OpenRound, actions) != []) == restarts
    if restarts:
        return
    [fail] = of(ev.Fail, actions)
    assert fail.message.startswith("no worker holding the committed training state is left")
    assert "host snapshots are off and there is no --checkpoint-dir" in fail.message
    assert sim.state.restarts == 0 and _total_loss(actions) == []


def test_the_same_loss_is_counted_once_while_the_cut_waits_for_slots() -> None:
    """Both hosts' workers are lost, and discovery drops b before the cut: the restart is
    decided (and counted) at the first cut, which then waits for --min-np slots; the cut
    that opens the round when a host comes counts nothing more."""
    sim = Sim(config(discovery_script="hosts.sh", np=2, min_np=2, elastic_timeout=60.0))
    sim.running({"a": 1, "b": 1})
    _all_exit(sim)
    sim.send(ev.HostsFound({"a": 1}))
    waiting = sim.advance(FAILURE_COLLECTION_S)
    assert of(ev.OpenRound, waiting) == [] and of(ev.Fail, waiting) == []
    assert sim.state.capacity_deadline is not None
    assert len(_total_loss(waiting)) == 1 and sim.state.restarts == 1
    sim.advance(10.0)
    actions = sim.send(ev.HostsFound({"a": 1, "c": 1}))
    [opened] = of(ev.OpenRound, actions)
    assert sorted(s.host for s in opened.assignment) == ["a", "c"]
    assert opened.new_workers == 2 and all(s.restore for s in of(ev.Spawn, actions))
    assert _total_loss(actions) == [] and sim.state.restarts == 1
    assert of(ev.Fail, sim.advance(120.0)) == []  # the capacity deadline is moot now


def test_a_restore_reported_by_a_sync_is_logged_and_reported() -> None:
    sim = _one_host()
    _all_exit(sim)
    sim.advance(FAILURE_COLLECTION_S)
    sim.started(of(ev.Spawn, sim.log))
    sim.join_all()
    rank0 = sim.members()[0]
    actions = sim.send(ev.WorkerSynced(rank0.id, 2, restored=(5, "host a")))
    [report] = [r for r in of(ev.Report, actions) if r.name == "state_restored"]
    assert report.fields == {"round": 2, "commit": 5, "source": "host a"}
    assert "round 2: restored from the snapshot of commit 5 (host a)" in \
        [a.message for a in of(ev.Log, actions) if a.level == "info"]
    assert not sim.state.restoring
    assert "state_restored" not in reports(sim.send(ev.WorkerSynced(sim.members()[1].id, 2)))


def test_after_a_restored_round_new_workers_are_not_told_to_restore() -> None:
    sim = Sim(config(np=2, min_np=1, discovery_script="hosts.sh"))
    sim.running({"a": 1, "b": 1})
    _all_exit(sim)
    sim.advance(FAILURE_COLLECTION_S)
    _restarted_round_runs(sim)
    before = len(sim.log)
    sim.send(ev.WorkerExited(sim.worker_on("b").id, 1))  # an ordinary failure now
    sim.send(ev.HostsFound({"a": 1, "b": 1, "c": 1}))
    sim.advance(FAILURE_COLLECTION_S)
    assert sim.state.round_number == 3
    spawns = of(ev.Spawn, sim.log[before:])  # b's new worker, and c's
    assert sorted(s.slot.host for s in spawns) == ["b", "c"]
    assert not any(s.restore for s in spawns) and sim.state.restarts == 1


def _holders_lost_while_a_new_member_had_not_reported() -> Sim:
    """Round 2 adds c; a and b, the workers known to hold the commit, die before c reports
    its sync (c may hold it, or not)."""
    sim = Sim(config(np=2, min_np=1, max_np=4, discovery_script="hosts.sh"))
    sim.running({"a": 1, "b": 1})
    sim.started(sim.send(ev.HostsFound({"a": 1, "b": 1, "c": 1})))
    for standby in list(sim.state.growth.ids):
        sim.send(ev.JoinAsked(standby, 0))
    sim.join_all(last_round=1, committed=True)
    sim.advance(0.0)
    sim.join_all(last_round=1)
    _all_exit_on(sim, "a", "b")
    sim.advance(FAILURE_COLLECTION_S)
    sim.advance(SYNC_REPORT_WAIT_S)  # no report came: the restart is decided
    return sim


def _all_exit_on(sim: Sim, *hosts: str) -> None:
    for host in hosts:
        sim.send(ev.WorkerExited(sim.worker_on(host).id, 1))


def test_a_member_that_may_hold_the_commit_is_rank_0_of_the_restart() -> None:
    """If c holds the commit it is the sync's root (rank 0); if not, no rank does and the
    round restores the kept one: either way nothing trains from scratch."""
    sim = _holders_lost_while_a_new_member_had_not_reported()
    [opened] = [o for o in of(ev.OpenRound, sim.log) if o.number == 3]
    assert opened.new_workers == 2
    ranks = {slot.host: info.rank for slot, info in opened.assignment.items()}
    assert ranks["c"] == 0
    spawns = [s for s in of(ev.Spawn, sim.log) if s.round == 3]
    assert sorted(s.slot.host for s in spawns) == ["a", "b"] and all(s.restore for s in spawns)
    assert _total_loss(sim.log)[0].fields["hosts"] == []  # nothing was blacklisted


def test_restoring_ends_with_the_restarted_rounds_sync_even_if_nothing_was_restored() -> None:
    sim = _holders_lost_while_a_new_member_had_not_reported()
    sim.started([s for s in of(ev.Spawn, sim.log) if s.round == 3])
    sim.join_all()
    sim.sync_all()  # c held the commit: its sync restored nothing
    before = len(sim.log)
    sim.send(ev.WorkerExited(sim.worker_on("b").id, 1))
    sim.send(ev.HostsFound({"a": 1, "b": 1, "c": 1, "d": 1}))
    sim.advance(FAILURE_COLLECTION_S)
    spawns = of(ev.Spawn, sim.log[before:])
    assert sorted(s.slot.host for s in spawns) == ["b", "d"]
    assert not any(s.restore for s in spawns)
