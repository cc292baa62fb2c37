"""Restart mode as tables: a round of scripts that never call er.init() (torchrun-style) is
restarted whole when a worker fails or the hosts change (pure, simulated time)."""

from __future__ import annotations

from elasticrun.driver.rounds import events as ev
from elasticrun.driver.rounds.restarts import STOP_SLACK_S
from elasticrun.driver.rounds.state import JobPhase, WorkerStatus
from elasticrun.system.process_view import ProcessState, ProcessView
from tests.unit.machine_sim import Sim, config, of, reports

HOSTS = {"a": 2, "b": 2}


def plain_sim(**overrides: object) -> Sim:
    sim = Sim(config(**{"np": 4, "min_np": 4, "max_np": 4, "max_restarts": 3, **overrides}))
    sim.start(HOSTS)
    return sim


def gone(sim: Sim, actions: list[ev.Action]) -> list[ev.Action]:
    """Every worker the actions stop exits (as SIGTERM ends it)."""
    out: list[ev.Action] = []
    for stop in of(ev.StopWorkers, actions):
        for worker in stop.workers:
            out += sim.send(ev.WorkerExited(worker, -15))
    return out


def test_a_failed_worker_restarts_every_worker_and_blacklists_nothing() -> None:
    sim = plain_sim()
    first = {w.id for w in sim.members()}
    dead = sim.worker_on("b", 1)
    actions = sim.send(ev.WorkerExited(dead.id, -9))
    assert [f.cause for f in of(ev.RecordFailure, actions)] == [
        "rank 3 on host b was killed by SIGKILL"]
    stopped = {w for stop in of(ev.StopWorkers, actions) for w in stop.workers}
    assert stopped == first - {dead.id}
    assert of(ev.BreakRound, actions) == [ev.BreakRound(1)]
    assert not sim.state.hosts.is_blacklisted("b", sim.now)
    assert sim.state.round_number == 1  # waits for them to go
    assert not of(ev.OpenRound, sim.advance(1.0))
    actions = gone(sim, actions)
    assert sim.state.restarts == 1  # counted once they are gone, no host lost meanwhile
    assert "round_restarting" in reports(actions)
    assert [o.number for o in of(ev.OpenRound, actions)] == [2]
    spawns = of(ev.Spawn, actions)
    assert sorted((s.slot.host, s.slot.index) for s in spawns) == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert {s.restarts for s in spawns} == {1} and {s.round for s in spawns} == {2}
    assert not {s.worker for s in spawns} & first  # every slot a new process
    assert sim.state.phase is JobPhase.RUNNING and sim.state.restart is None


def test_restarts_count_up_to_max_restarts_then_the_job_fails_naming_it() -> None:
    sim = plain_sim(max_restarts=2)
    for count in (1, 2):
        actions = sim.send(ev.WorkerExited(sim.worker_on("a").id, 1))
        sim.started(gone(sim, actions))
        assert sim.state.restarts == count and sim.state.round_number == count + 1
    actions = sim.send(ev.WorkerExited(sim.worker_on("a").id, 1))
    fail = of(ev.Fail, gone(sim, actions))  # the job ends once every worker has stopped
    assert fail and fail[0].message == ("rank 0 on host a exited with code 1; --max-restarts "
                                        "2 spent (restarted 2 time(s))")


def test_max_restarts_0_ends_the_job_at_the_first_failure_as_torchrun_does() -> None:
    sim = plain_sim(max_restarts=0)
    actions = sim.send(ev.WorkerExited(sim.worker_on("b").id, 1))
    fail = of(ev.Fail, gone(sim, actions))
    assert fail and "--max-restarts is 0" in fail[0].message


def test_a_second_failure_during_a_restart_is_part_of_it() -> None:
    sim = plain_sim()
    actions = sim.send(ev.WorkerExited(sim.worker_on("a").id, 1))
    actions += sim.send(ev.WorkerExited(sim.worker_on("b").id, 1))  # its collective broke
    actions += gone(sim, actions)
    assert sim.state.restarts == 1 and not of(ev.Fail, actions)


def test_a_failure_explained_by_a_host_lost_meanwhile_is_not_counted() -> None:
    """A node dies: the others' collectives fail at once, and one of them may report its
    error before the node's loss is known. Once every member is gone, the lost host
    explains it."""
    sim = Sim(config(np=4, min_np=2, max_np=4, max_restarts=0, discovery="script:x"))
    sim.start(HOSTS)
    failing = sim.worker_on("a", 0)
    actions = sim.send(ev.WorkerFailing(failing.id, "RuntimeError: Connection reset by peer"))
    actions += sim.send(ev.WorkerExited(failing.id, 1))
    for worker in (sim.worker_on("b", 0), sim.worker_on("b", 1)):
        actions += sim.send(ev.WorkerExited(worker.id, 255, host_lost=True))
    actions += sim.send(ev.HostsFound({"a": 2}))
    actions = gone(sim, actions)
    assert not of(ev.Fail, actions) and sim.state.restarts == 0
    assert [sorted(s.host for s in o.assignment) for o in of(ev.OpenRound, actions)] == [
        ["a", "a"]]


def test_a_failure_after_a_member_finished_restarts_the_round() -> None:
    """torchrun restarts the whole group when any worker fails, finished ones too."""
    sim = plain_sim()
    members = sim.members()
    sim.send(ev.WorkerExited(members[0].id, 0))
    assert sim.state.phase is JobPhase.FINISHING
    actions = sim.send(ev.WorkerExited(members[1].id, 1))
    actions = gone(sim, actions)
    assert not of(ev.Fail, actions) and sim.state.restarts == 1
    assert [o.number for o in of(ev.OpenRound, actions)] == [2]


def test_every_member_exiting_0_finishes_the_job() -> None:
    sim = plain_sim()
    actions = []
    for worker in sim.members():
        actions += sim.send(ev.WorkerExited(worker.id, 0))
    assert of(ev.Finish, actions) == [ev.Finish(0)]


def test_a_member_that_does_not_stop_fails_its_host_at_the_deadline() -> None:
    sim = plain_sim(stop_grace_period=5.0)
    actions = sim.send(ev.WorkerExited(sim.worker_on("a").id, 1))
    stuck = sim.worker_on("b", 0)
    for stop in of(ev.StopWorkers, actions):
        for worker in stop.workers:
            if worker != stuck.id:
                sim.send(ev.WorkerExited(worker, -15))
    assert not of(ev.OpenRound, sim.advance(5.0 + STOP_SLACK_S - 0.1))
    actions = sim.advance(0.1)
    assert sim.state.hosts.is_blacklisted("b", sim.now)
    # 2 slots left for --min-np 4, and no worker of the job has worked yet (run a minute):
    # its cooldown is not waited for
    [fail] = of(ev.Fail, actions)
    assert fail.message == "no progress possible: only 2 slot(s) left, --min-np is 4"


def test_hosts_added_restart_the_round_without_counting_and_without_standbys() -> None:
    sim = Sim(config(np=2, min_np=2, max_np=4, discovery="script:x"))
    sim.start({"a": 2})
    actions = sim.send(ev.HostsFound({"a": 2, "b": 2}))
    assert not [s for s in of(ev.Spawn, actions) if s.standby]
    actions += sim.advance(0.0)
    assert of(ev.StopWorkers, actions) and sim.state.restarts == 0
    actions = gone(sim, actions)
    assert [len(o.assignment) for o in of(ev.OpenRound, actions)] == [4]
    assert {s.restarts for s in of(ev.Spawn, actions)} == {0}


def test_a_host_gone_restarts_the_round_on_those_left() -> None:
    sim = Sim(config(np=4, min_np=2, max_np=4, discovery="script:x"))
    sim.start(HOSTS)
    actions = sim.send(ev.HostsFound({"a": 2}))
    actions += sim.advance(0.0)
    actions = gone(sim, actions)
    assert [sorted(s.host for s in o.assignment) for o in of(ev.OpenRound, actions)] == [
        ["a", "a"]]


def test_unchanged_hosts_leave_a_plain_round_alone() -> None:
    sim = plain_sim()
    actions = sim.send(ev.HostsFound(HOSTS))
    assert not of(ev.StopWorkers, actions) and sim.state.round_number == 1


def test_a_stopped_worker_is_found_through_stall_reports_and_restarts_the_round() -> None:
    """Plain workers' footholds report an idle training thread; the round is probed although
    it never completes (nobody joins), and a member whose host says it is stopped is hung."""
    sim = plain_sim()
    stopped = sim.worker_on("b", 1)
    reporter = sim.worker_on("a", 0)
    actions = sim.send(ev.WorkerStalled(reporter.id, 1, 2.0))
    assert of(ev.ProbeRound, actions) and of(ev.InspectWorkers, actions)
    actions = sim.send(ev.ProcessesInspected(1, (
        (stopped.id, ProcessView(ProcessState.STOPPED, "stopped (SIGSTOP)")),)))
    assert ev.StopWorkers((stopped.id,), kill=True) in actions
    assert "hung: its process is stopped (SIGSTOP)" in of(ev.RecordFailure, actions)[0].cause
    actions += sim.send(ev.WorkerExited(stopped.id, -9))
    gone(sim, actions)
    assert sim.state.restarts == 1 and not sim.state.hosts.is_blacklisted("b", sim.now)


def test_a_spawn_failure_counts_as_a_restart_and_fails_its_host() -> None:
    sim = Sim(config(np=2, min_np=1, max_np=4, discovery="script:x"))
    actions = sim.send(ev.JobStarted(HOSTS))
    spawns = of(ev.Spawn, actions)
    sim.started(spawns[:-1])
    actions = sim.send(ev.SpawnFailed(spawns[-1].worker, "no such file"))
    assert sim.state.hosts.is_blacklisted(spawns[-1].slot.host, sim.now)
    gone(sim, actions)
    assert sim.state.restarts == 1


def test_a_script_known_to_call_init_is_never_restarted_even_before_it_joins() -> None:
    """Its script imports elasticrun (read before the job starts), or a worker's er.init()
    said so: a failure before anyone joined fails that worker alone, as always, and the
    others go on (they get their place when they join)."""
    imports = Sim(config(np=4, min_np=2, discovery="script:x"), elastic_scripts=True)
    imports.start(HOSTS)
    said = Sim(config(np=4, min_np=2, discovery="script:x"))
    said.start(HOSTS)
    said.send(ev.InitCalled(said.worker_on("a").id))
    for sim in (imports, said):
        sim.send(ev.WorkerExited(sim.worker_on("b").id, 1))
        assert not sim.state.hosts.is_blacklisted("b", sim.now) and sim.state.restart is None
        assert not any(w.status is WorkerStatus.STOPPING for w in sim.members())


def test_a_script_that_calls_init_keeps_in_process_recovery() -> None:
    sim = Sim(config(np=4, min_np=2))
    sim.running(HOSTS)
    assert sim.state.elastic_scripts
    actions = sim.send(ev.WorkerExited(sim.worker_on("b").id, 1))
    assert not sim.state.hosts.is_blacklisted("b", sim.now) and sim.state.restarts == 0
    assert not any(w.status is WorkerStatus.STOPPING for w in sim.members())
    assert not of(ev.Fail, actions)


def test_an_unreachable_host_fails_and_the_restart_does_not_wait_for_its_workers() -> None:
    """A frozen host or a cut link: its workers can neither answer nor be stopped. The
    round restarts at once on the other hosts, if they are enough."""
    sim = Sim(config(np=4, min_np=2, max_np=4, max_restarts=3, discovery="script:x"))
    sim.start(HOSTS)
    frozen = [sim.worker_on("b", 0), sim.worker_on("b", 1)]
    actions = sim.send(ev.WorkerStalled(sim.worker_on("a", 0).id, 1, 2.0))
    actions += sim.advance(0.5)  # a probe unanswered by b's members
    actions += sim.send(ev.ProcessesInspected(1, tuple(
        (w.id, ProcessView(ProcessState.UNREACHABLE, "no answer within 2s")) for w in frozen)))
    assert sim.state.hosts.is_blacklisted("b", sim.now)
    actions = []
    for worker in (sim.worker_on("a", 0), sim.worker_on("a", 1)):
        actions += sim.send(ev.WorkerExited(worker.id, -15))  # b's never come
    assert sim.state.restarts == 1
    assert [sorted(s.host for s in o.assignment) for o in of(ev.OpenRound, actions)] == [
        ["a", "a"]]


def test_a_worker_lost_with_its_host_restarts_the_round_without_counting() -> None:
    """A node preempted or killed: its agent's connection closes and its workers are lost
    with it (255). That is the hosts changing, whichever comes first: this exit or
    discovery's word."""
    sim = Sim(config(np=4, min_np=2, max_np=4, max_restarts=0, discovery="script:x"))
    sim.start(HOSTS)
    actions = sim.send(ev.WorkerExited(sim.worker_on("b", 0).id, 255, host_lost=True))
    assert not of(ev.Fail, actions) and sim.state.restarts == 0
    assert [f.kind for f in of(ev.RecordFailure, actions)] == ["lost"]
    actions += sim.send(ev.WorkerExited(sim.worker_on("b", 1).id, 255, host_lost=True))
    actions += sim.send(ev.HostsFound({"a": 2}))
    actions = gone(sim, actions)
    assert [sorted(s.host for s in o.assignment) for o in of(ev.OpenRound, actions)] == [
        ["a", "a"]]


def _kill_after_a_peer_reported(sim: Sim, code: int, after: float) -> list[ev.Action]:
    """A peer's collective fails and it reports its error first; the rank whose death broke
    it is reported `after` seconds later, killed by `code` (as from another node, through
    its agent)."""
    peer, victim = sim.worker_on("a"), sim.worker_on("b", 1)
    actions = sim.send(ev.WorkerFailing(peer.id, "RuntimeError: Connection closed by peer"))
    actions += sim.advance(after)
    actions += sim.send(ev.WorkerExited(victim.id, code))
    actions += sim.send(ev.WorkerExited(peer.id, 1))  # once it has printed its error
    return actions + gone(sim, actions)


def test_a_rank_killed_from_outside_is_the_cause_not_the_peer_that_reported_first() -> None:
    sim = plain_sim(max_restarts=0)
    fail = of(ev.Fail, _kill_after_a_peer_reported(sim, -9, 0.2))
    assert fail and fail[0].message.startswith("rank 3 on host b was killed by SIGKILL; "), \
        fail[0].message


def test_a_rank_our_stop_ended_does_not_take_the_cause() -> None:
    for code, after in ((-15, 0.2), (-9, 6.0)):  # our SIGTERM; our SIGKILL after the grace
        sim = plain_sim(max_restarts=0)
        fail = of(ev.Fail, _kill_after_a_peer_reported(sim, code, after))
        assert fail and fail[0].message.startswith("rank 0 on host a failed: RuntimeError"), \
            fail[0].message
