"""The round machine resumed from its journal: workers taken back as they come, or failed at
the bound, and discovery held until then (pure, simulated time)."""

from __future__ import annotations

import json
import random

from elasticrun.driver.hosts.registry import HostRegistry
from elasticrun.driver.journal.codec import decode, encode
from elasticrun.driver.rounds import events as ev
from elasticrun.driver.rounds.resume import takes_back
from elasticrun.driver.rounds.state import JobPhase, WorkerStatus
from tests.unit.machine_sim import Sim, config, of, reports

BOUND = 30.0


def resumed(hosts: dict[str, int], *, form_only: bool = False) -> tuple[Sim, Sim]:
    """A job running on `hosts` (its round complete and synced, unless `form_only`), and a
    second machine resumed from its journal, as a restarted driver's is."""
    cfg = config(np=sum(hosts.values()), min_np=1, blacklist_cooldown=(10.0, 100.0))
    old = Sim(cfg)
    if form_only:  # one member of an elastic job (it calls er.init()) has asked to join
        old.start(hosts)
        old.send(ev.JoinAsked(old.members()[0].id, 0))
    else:
        old.running(hosts)
    body = json.loads(json.dumps(encode(old.state, old.now, 1_790_000_000.0)))
    new = Sim(cfg)
    new.machine.state = decode(body, HostRegistry((10.0, 100.0), random.Random(0)),
                               new.now, 1_790_000_005.0)
    new.send(ev.JobResumed(2, BOUND))
    return old, new


def test_every_member_back_is_readopted_as_it_was() -> None:
    old, new = resumed({"a": 2, "b": 1})
    members = sorted(w.id for w in new.members())
    assert all(takes_back(new.state, w.id, w.slot.host) for w in new.members())
    assert not takes_back(new.state, members[0], "elsewhere")
    actions: list[ev.Action] = []
    for worker in members:
        actions += new.send(ev.WorkerBack(worker))
    actions += new.send(ev.HostsFound({"a": 2, "b": 1}))  # discovery agrees
    assert new.state.resume is None and new.state.phase is JobPhase.RUNNING
    assert new.state.round_number == 1 and sorted(w.id for w in new.members()) == members
    assert "driver_resumed" in reports(actions)
    assert not of(ev.BreakRound, actions) and not of(ev.Spawn, actions)
    assert not of(ev.StopWorkers, actions)
    assert not takes_back(new.state, members[0], "a")  # decided: nobody is taken any more


def test_discovery_is_held_until_it_lists_the_hosts_of_those_back() -> None:
    """No agent has reconnected when the driver starts, and agents come back one by one: a
    list without some of them must not read as their hosts leaving."""
    _, new = resumed({"a": 1, "b": 1})
    assert not new.send(ev.HostsFound({}))  # held: nothing planned, nobody notified
    actions: list[ev.Action] = []
    for worker in new.members():
        actions += new.send(ev.WorkerBack(worker.id))
    assert new.state.resume is not None and new.state.resume.decided
    actions += new.send(ev.HostsFound({"b": 1}))  # a's agent is still saying hello
    assert new.state.hosts.discovered == {"a": 1, "b": 1} and new.state.resume is not None
    actions += new.send(ev.HostsFound({"b": 1, "a": 1}))
    assert new.state.resume is None and new.state.hosts.discovered == {"a": 1, "b": 1}
    assert new.state.notice_seq == 0 and not of(ev.PostNotice, actions)
    new.send(ev.HostsFound({"a": 1}))  # from now on, discovery is heard as usual
    assert new.state.notice_seq == 1


def test_at_the_bound_discovery_is_heard_whatever_it_says() -> None:
    _, new = resumed({"a": 1, "b": 1})
    for worker in new.members():
        new.send(ev.WorkerBack(worker.id))
    new.send(ev.HostsFound({"a": 1}))
    assert new.state.resume is not None
    new.advance(BOUND + 0.1)
    assert new.state.resume is None and new.state.hosts.discovered == {"a": 1}
    assert new.state.notice_seq == 1  # b is gone: the next round is announced


def test_a_member_missing_at_the_bound_is_failed_and_the_others_recover() -> None:
    _, new = resumed({"a": 1, "b": 1, "c": 1})
    lost = new.worker_on("c")
    for worker in new.members():
        if worker is not lost:
            new.send(ev.WorkerBack(worker.id))
    assert new.state.resume is not None  # still waiting for c
    actions = new.advance(BOUND + 0.1)
    assert new.state.resume is None
    assert not lost.alive and lost.status is WorkerStatus.FAILED
    assert new.state.hosts.is_blacklisted("c", new.now)
    assert of(ev.BreakRound, actions) == [ev.BreakRound(1)]
    failures = of(ev.RecordFailure, actions)
    assert [f.cause for f in failures] == ["rank 2 on host c did not come back to the "
                                           "restarted driver"]
    new.advance(1.0)  # failures collected: the next round without c
    assert new.state.round_number == 2 and {s.host for s in new.state.assignment} == {"a", "b"}


def test_a_round_that_was_forming_is_cut_afresh_with_those_back() -> None:
    _, new = resumed({"a": 1, "b": 1}, form_only=True)
    assert new.state.round is not None and not new.state.round.complete
    actions: list[ev.Action] = []
    for worker in new.members():
        actions += new.send(ev.WorkerBack(worker.id))
    assert of(ev.BreakRound, actions) == [ev.BreakRound(1)]
    actions += new.advance(1.0)
    assert new.state.round_number == 2
    assert not of(ev.Spawn, actions)  # the same processes, in a new round


def test_a_round_of_scripts_that_never_call_init_is_readopted_as_it_runs() -> None:
    """Plain scripts (torchrun-style) never join: their round is not a forming one."""
    cfg = config(np=2, min_np=1)
    old = Sim(cfg)
    old.start({"a": 1, "b": 1})
    body = json.loads(json.dumps(encode(old.state, old.now, 1_790_000_000.0)))
    new = Sim(cfg)
    new.machine.state = decode(body, HostRegistry(None, random.Random(0)), new.now,
                               1_790_000_005.0)
    assert not new.state.elastic_scripts
    new.send(ev.JobResumed(2, BOUND))
    actions: list[ev.Action] = []
    for worker in new.members():
        actions += new.send(ev.WorkerBack(worker.id))
    actions += new.send(ev.HostsFound({"a": 1, "b": 1}))
    assert new.state.resume is None and new.state.round_number == 1
    assert not of(ev.BreakRound, actions) and not of(ev.StopWorkers, actions)



def test_workers_that_ended_with_the_old_driver_are_not_waited_for() -> None:
    """SSH workers end with their driver's connection: once every worker that can come back
    has, the others are failed at once instead of at the bound."""
    cfg = config(np=2, min_np=1, blacklist_cooldown=(10.0, 100.0))
    old = Sim(cfg)
    old.running({"local": 1, "remote": 1})
    body = json.loads(json.dumps(encode(old.state, old.now, 1_790_000_000.0)))
    new = Sim(cfg)
    new.machine.state = decode(body, HostRegistry((10.0, 100.0), random.Random(0)),
                               new.now, 1_790_000_005.0)
    remote = new.worker_on("remote")
    new.send(ev.JobResumed(2, BOUND, lost=(remote.id,)))
    actions = new.send(ev.WorkerBack(new.worker_on("local").id))
    assert not remote.alive and new.state.hosts.is_blacklisted("remote", new.now)
    assert [f.cause for f in of(ev.RecordFailure, actions)] == [
        "rank 1 on host remote ended with the old driver (its launcher does not outlive it)"]
    assert of(ev.BreakRound, actions)  # the usual recovery, now rather than at the bound


def test_a_failure_while_the_driver_waits_is_recovered_once_it_knows_who_is_back() -> None:
    """A worker's exit (its agent came back first, with the exit queued) breaks the round;
    the next round is cut only once the others are back, not around workers not yet
    taken back."""
    _, new = resumed({"a": 1, "b": 1, "c": 1})
    dead = new.worker_on("c")
    actions = new.send(ev.WorkerExited(dead.id, -9))
    actions += new.advance(1.0)  # the failure-collection time passes: no cut yet
    assert new.state.round_number == 1 and not of(ev.OpenRound, actions)
    for host in ("a", "b"):
        actions += new.send(ev.WorkerBack(new.worker_on(host).id))
    actions += new.advance(1.0)
    assert new.state.round_number == 2 and {s.host for s in new.state.assignment} == {"a", "b"}
    assert len(of(ev.RecordFailure, actions)) == 1  # the exit's, not a second for "missing"
    # the survivors go on in their own processes; c's slot gets a new worker
    assert [s.slot.host for s in of(ev.Spawn, actions)] == ["c"]
