"""Finding a hung member of a round (driver/rounds/liveness.py), as tables against the real
round machine: stall reports, probe answers and what the hosts say -> verdicts.

A hung member's host is failed as a failed exit's is (blacklisted, its workers stopped, the
round broken); the hung worker itself is killed at once. A slow member is never failed:
one that answers, and one whose host says it runs (a GC pause holds its GIL).
"""

from __future__ import annotations

from elasticrun.driver.rounds import events as ev
from elasticrun.driver.rounds.liveness import PROBE_EVERY_S, PROBE_S, STALL_LAPSE_S
from elasticrun.driver.rounds.state import WorkerRecord, WorkerStatus
from elasticrun.system.process_view import ProcessState, ProcessView
from tests.unit.machine_sim import Sim, config, of

TWO_HOSTS = {"a": 2, "b": 2}
STOPPED = ProcessView(ProcessState.STOPPED, "stopped (SIGSTOP)")
RUNNING = ProcessView(ProcessState.RUNNING, "R")
UNREACHABLE = ProcessView(ProcessState.UNREACHABLE, "probe timed out after 1.0s")
UNKNOWN = ProcessView(ProcessState.UNKNOWN)


def running(**overrides: object) -> tuple[Sim, list[WorkerRecord]]:
    sim = Sim(config(**overrides))
    sim.running(TWO_HOSTS)
    return sim, sorted(sim.members(), key=lambda w: w.rank)


def stall(sim: Sim, reporter: WorkerRecord) -> list[ev.Action]:
    return sim.send(ev.WorkerStalled(reporter.id, sim.state.round_number, 0.3))


def answer(sim: Sim, worker: WorkerRecord, *, inside: bool = True, since: float = 0.0,
           cpu: float | None = 1.0) -> list[ev.Action]:
    stall_ = sim.state.stall
    assert stall_ is not None
    return sim.send(ev.ProbeAnswered(worker.id, sim.state.round_number, stall_.probe,
                                     inside, since, cpu))


def inspect(sim: Sim, *views: tuple[WorkerRecord, ProcessView]) -> list[ev.Action]:
    return sim.send(ev.ProcessesInspected(sim.state.round_number,
                                          tuple((w.id, v) for w, v in views)))


def failed(actions: list[ev.Action]) -> list[str]:
    return [f.cause for f in of(ev.RecordFailure, actions)]


def test_nothing_is_asked_until_a_member_reports_a_stall() -> None:
    sim, _ = running()
    assert sim.state.stall is None
    assert not of(ev.ProbeRound, sim.advance(60.0)) and not of(ev.InspectWorkers, sim.log)


def test_a_stall_probes_the_round_and_asks_the_hosts_about_the_others() -> None:
    sim, members = running()
    actions = stall(sim, members[0])
    assert of(ev.ProbeRound, actions) == [ev.ProbeRound(1, sim.state.probe_seq)]
    [inspect_] = of(ev.InspectWorkers, actions)
    assert set(inspect_.workers) == {w.id for w in members[1:]}


def test_a_stopped_member_is_hung_killed_and_its_slot_refilled() -> None:
    sim, members = running()
    stall(sim, members[0])
    victim = members[3]  # on host b
    actions = inspect(sim, (members[1], RUNNING), (victim, STOPPED))
    assert failed(actions) == ["rank 3 on host b hung: its process is stopped (SIGSTOP)"]
    assert of(ev.RecordFailure, actions)[0].kind == "hang"
    assert ev.StopWorkers((victim.id,), kill=True) in actions
    assert of(ev.BreakRound, actions) == [ev.BreakRound(1)]
    assert not sim.state.hosts.holds_out("b", sim.now)  # one hang says little of b
    assert victim.status is WorkerStatus.FAILED and sim.state.stall is None
    # Its exit after the kill is not a second failure.
    assert failed(sim.send(ev.WorkerExited(victim.id, -9))) == []


def test_an_unreachable_host_fails_its_silent_members_only() -> None:
    sim, members = running()
    stall(sim, members[0])
    sim.now += 1.0  # the host's probe timed out; member 2 answered meanwhile
    answer(sim, members[2])
    assert failed(inspect(sim, (members[2], UNREACHABLE))) == []  # it answers: it lives
    actions = inspect(sim, (members[3], UNREACHABLE))
    [cause] = failed(actions)
    assert cause.startswith("rank 3 on host b hung: no heartbeat for 1.0s, and its host "
                            "does not answer (probe timed out")


def test_a_member_whose_host_says_it_runs_is_never_failed_however_long_it_is_silent() -> None:
    """A GC pause of seconds holds the GIL: no answer, but the process runs."""
    sim, members = running()
    stall(sim, members[0])
    inspect(sim, (members[3], RUNNING))
    for _ in range(20):  # 20 s of stall, members 0..2 answering, member 3 silent
        for worker in members[:3]:
            answer(sim, worker)
        stall(sim, members[0])
        actions = sim.advance(1.0)
        inspect(sim, (members[3], RUNNING))
        assert not failed(actions)
    assert sim.state.stall is not None and not sim.state.hosts.is_blacklisted("b", sim.now)


def test_a_silent_member_on_a_host_that_cannot_tell_is_hung_after_the_hang_timeout() -> None:
    sim, members = running(hang_timeout=3.0)
    stall(sim, members[0])
    inspect(sim, (members[3], UNKNOWN))
    causes: list[str] = []
    while not causes and sim.now < 1010.0:
        for worker in members[:3]:
            answer(sim, worker)
        stall(sim, members[0])
        causes = failed(sim.advance(0.25))
    [cause] = causes
    prefix = "rank 3 on host b hung: no heartbeat for "
    assert cause.startswith(prefix) and cause.endswith("s")
    assert 3.0 <= float(cause[len(prefix):-1]) <= 3.0 + PROBE_EVERY_S  # judged at probes


def test_a_member_stuck_outside_collectives_is_hung_after_the_stuck_timeout() -> None:
    """It answers (its watcher lives), but its training thread has been outside collectives,
    using no CPU, while its peers waited."""
    sim, members = running(stuck_timeout=10.0)
    stall(sim, members[0])
    causes: list[str] = []
    while not causes and sim.now < 1030.0:
        for worker in members[:3]:
            answer(sim, worker)
        answer(sim, members[3], inside=False, since=sim.now - 1000.0, cpu=5.0)
        stall(sim, members[0])
        causes = failed(sim.advance(0.5))
    [cause] = causes
    assert cause.startswith("rank 3 on host b hung: stuck outside collectives for ")
    assert 10.0 <= sim.now - 1000.0 <= 10.0 + PROBE_EVERY_S  # checked at each probe


def test_a_slow_member_outside_collectives_that_uses_cpu_is_never_stuck() -> None:
    """A long first step, a big checkpoint save: outside collectives, but computing."""
    sim, members = running(stuck_timeout=5.0)
    stall(sim, members[0])
    for tick in range(60):
        for worker in members[:3]:
            answer(sim, worker)
        answer(sim, members[3], inside=False, since=tick * 0.5, cpu=1.0 + tick)
        stall(sim, members[0])
        assert not failed(sim.advance(0.5))


def test_the_stall_ends_when_reports_stop_and_is_probed_every_few_seconds_meanwhile() -> None:
    sim, members = running()
    stall(sim, members[0])
    probes = []
    for _ in range(8):
        stall(sim, members[0])
        probes += [sim.now for _ in of(ev.ProbeRound, sim.advance(1.0))]
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    assert len(gaps) >= 2 and all(abs(gap - PROBE_EVERY_S) < 0.3 for gap in gaps)
    sim.advance(STALL_LAPSE_S + 4.0)
    assert sim.state.stall is None
    assert not of(ev.ProbeRound, sim.advance(30.0))


def test_reports_of_another_round_or_from_a_non_member_are_ignored() -> None:
    sim, members = running()
    assert sim.send(ev.WorkerStalled(members[0].id, 7, 0.3)) == []
    assert sim.send(ev.WorkerStalled("nobody", 1, 0.3)) == []
    assert sim.state.stall is None


def test_no_hang_detection_ignores_stalls() -> None:
    sim, members = running(hang_detection=False)
    assert stall(sim, members[0]) == [] and sim.state.stall is None


def test_a_member_that_hangs_during_a_lasting_stall_is_looked_at_within_the_backoff() -> None:
    """The round has been stalled by a slow peer for a while (probes backed off) when a
    member stops: it is asked about at the next probe, and found stopped, not judged by
    its silence alone."""
    sim, members = running(hang_timeout=1.0)
    stall(sim, members[0])
    for _ in range(10):  # 10 s of a stall everybody answers
        for worker in members:
            answer(sim, worker)
        stall(sim, members[0])
        sim.advance(1.0)
    stopped_at = sim.now
    asked: list[ev.InspectWorkers] = []
    while not asked:
        for worker in members[:3]:
            answer(sim, worker)
        stall(sim, members[0])
        actions = sim.advance(0.25)
        assert not failed(actions)  # silent, but its host not asked yet: no verdict
        asked = of(ev.InspectWorkers, actions)
    assert asked == [ev.InspectWorkers(1, (members[3].id,))]
    assert sim.now - stopped_at <= PROBE_EVERY_S + PROBE_S
    assert failed(inspect(sim, (members[3], STOPPED))) == [
        "rank 3 on host b hung: its process is stopped (SIGSTOP)"]


def forming(**overrides: object) -> tuple[Sim, list[WorkerRecord]]:
    """Round 1 opened; every member but rank 3 joined (so none can build or sync)."""
    sim = Sim(config(**overrides))
    sim.start(TWO_HOSTS)
    members = sorted(sim.members(), key=lambda w: w.rank)
    for worker in members[:3]:
        sim.send(ev.JoinAsked(worker.id, 0))
    return sim, members


def test_a_laggard_of_a_forming_round_is_asked_about_and_found_stopped() -> None:
    """A member stopped before it joined (or built its group): no collective stalls, yet it
    is found in about a second, not at the check-in deadline."""
    sim, members = forming()
    asked = of(ev.InspectWorkers, sim.advance(1.0))
    assert asked == [ev.InspectWorkers(1, tuple(sorted(w.id for w in members)))]
    actions = inspect(sim, *((w, RUNNING) for w in members[:3]), (members[3], STOPPED))
    assert failed(actions) == ["rank 3 on host b hung: its process is stopped (SIGSTOP)"]
    assert ev.StopWorkers((members[3].id,), kill=True) in actions


def test_a_forming_rounds_laggards_are_asked_at_doubling_intervals_then_left_alone() -> None:
    """A slow starter (importing torch) runs: nothing happens to it; the questions thin out
    and stop at the collective timeout (10 s here), where the usual bounds take over."""
    sim, members = forming()
    times = []
    for _ in range(40):
        for _ in of(ev.InspectWorkers, sim.advance(0.5)):
            times.append(round(sim.now - 1000.0, 1))
            assert not failed(inspect(sim, (members[3], RUNNING)))
    assert times == [1.0, 2.0, 4.0, 8.0, 16.0]


def test_an_unreachable_laggard_is_left_to_the_check_in_and_a_settled_round_to_itself(
        ) -> None:
    """A forming round's members send nothing while they start (importing torch on a
    loaded host, whose sshd answers slowly too): a host that does not answer is no proof.
    (Seen in CI: SSH workers starting up failed as hung.)"""
    sim, members = forming()
    sim.advance(1.0)
    assert failed(inspect(sim, (members[3], UNREACHABLE))) == []
    settled = Sim(config())
    settled.running(TWO_HOSTS)
    assert not of(ev.InspectWorkers, settled.advance(30.0))
