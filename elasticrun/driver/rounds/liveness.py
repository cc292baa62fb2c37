"""Pure: finding a hung member of a round in seconds, never a merely slow one.

Nothing is exchanged while collectives flow. A member that waits in a collective far longer
than its collectives take reports a stall (a few designated members do, worker/liveness.py);
the round's members are then probed (their notice watchers, threads that do not train,
answer at once) and their hosts are asked what the processes are doing. The stall lasts
while reports, or answers from inside a collective, keep coming. A member is hung when:
- its host says its process is stopped (SIGSTOP, a tracer): it can do nothing, ever;
- its host does not answer, and neither has it since the stall began (a frozen host, a
  cut link);
- its host cannot tell (a launcher without process states) and it has not answered for
  --hang-timeout;
- it answers, but its training thread has been outside collectives, using no CPU, for
  --stuck-timeout while its peers waited (a deadlocked data loader).
Members of a plain round (scripts that never call er.init(): restarts.py) report a stall
when their training thread has used no CPU for a while (worker/foothold.py), and always
answer probes as waiting in a collective: they can be found stopped or unreachable, never
stuck. A round being formed (a member not joined, its group not built, its state not
synced) has no collectives to stall: its laggards' hosts are asked too, from a second after
its first join, and a laggard whose process is stopped is hung (one whose host does not
answer may be starting up on a loaded host: the check-in bounds apply to it).
A member that does not answer while its host says it runs holds its GIL (a long GC pause, a
long C call): slow, not hung. A lasting stall is probed every few seconds; it ends when the
reports stop. The functions return the verdicts; the machine fails the hosts (worker_ends.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from elasticrun.driver.rounds import restarts
from elasticrun.driver.rounds.actions import InspectWorkers, ProbeRound, TimerKind
from elasticrun.driver.rounds.events import ProbeAnswered, ProcessesInspected, WorkerStalled
from elasticrun.driver.rounds.state import JobPhase, Stall, WorkerRecord
from elasticrun.driver.rounds.step import Step
from elasticrun.system.process_view import ProcessState

PROBE_S = 0.5  # how long members get to answer a probe before silent ones are looked at
# A lasting stall's members are probed again every this many seconds (a member that hangs
# while its round is already stalled, by a slow peer, is looked at within about this long),
# and at least PROBE_PER_MEMBER_S a member: every probe costs the driver an answer from
# each member (about 0.25 ms), so a lasting stall of 4,096 members costs it a few percent
# of a core. Between probes nothing is asked; the silent are judged PROBE_S after each.
PROBE_EVERY_S = 2.0
PROBE_PER_MEMBER_S = 0.0025
WAITING_S = 0.25  # an answer from inside a collective this long: the stall goes on
# Stalled members repeat their report every second (worker/liveness.py): none for this
# long, and the stall is over.
STALL_LAPSE_S = 2.5
CPU_RESOLUTION_S = 0.02  # a change of CPU time below this is no change (clock ticks)


@dataclass(frozen=True)
class Verdict:
    worker: WorkerRecord
    reason: str
    unreachable: bool = False  # its host does not answer: it cannot be stopped either


def stalled(step: Step, event: WorkerStalled) -> None:
    if not _watching(step, event.round, event.worker):
        return
    state, now = step.state, step.now
    stall = state.stall
    if stall is None or stall.round != event.round:
        stall = state.stall = Stall(event.round, started=now, last_report=now)
        rank = state.workers[event.worker].rank
        step.log("debug", f"round {event.round}: rank {rank} waited {event.waited_s:.2f}s in "
                          f"a collective; probing the round's members")
        _probe(step, stall)
        others = sorted(_members(step) - {event.worker})
        if others:
            step.emit(InspectWorkers(event.round, tuple(others)))
    stall.last_report = now
    stall.heard[event.worker] = now
    stall.answered.add(event.worker)
    stall.outside.pop(event.worker, None)


def answered(step: Step, event: ProbeAnswered) -> None:
    stall = step.state.stall
    if stall is None or stall.round != event.round or not _watching(step, event.round,
                                                                     event.worker):
        return
    now = step.now
    stall.heard[event.worker] = now
    if event.probe == stall.probe:
        stall.answered.add(event.worker)
    if event.in_collective:
        stall.outside.pop(event.worker, None)
        if event.since_s >= WAITING_S:
            stall.last_report = now
    else:
        stall.outside[event.worker] = now - max(0.0, event.since_s)
    if event.cpu_s is not None:
        seen = stall.cpu.get(event.worker)
        if seen is None or abs(event.cpu_s - seen[0]) >= CPU_RESOLUTION_S:
            stall.cpu[event.worker] = (event.cpu_s, now)


def inspected(step: Step, event: ProcessesInspected) -> list[Verdict]:
    state = step.state
    current = state.round
    if current is None or not _current(step, event.round):
        return []
    stall = state.stall if state.stall is not None and state.stall.round == event.round \
        else None
    verdicts = []
    for worker_id, view in event.views:
        worker = state.workers.get(worker_id)
        if worker is None or not worker.alive or worker_id not in current.member_ids:
            continue
        if stall is not None:
            stall.views[worker_id] = view
        if view.state is not ProcessState.RUNNING:
            step.log("debug", f"round {event.round}: host {worker.slot.host} says rank "
                              f"{worker.rank} is {view.state.value} ({view.detail})")
        if view.state is ProcessState.STOPPED:
            verdicts.append(Verdict(worker, f"its process is {view.detail or 'stopped'}"))
        elif view.state is not ProcessState.UNREACHABLE:
            continue
        elif stall is not None:  # (a forming round's laggard may be starting up slowly)
            quiet = step.now - stall.heard.get(worker_id, stall.started)
            if quiet >= PROBE_S:
                verdicts.append(Verdict(worker, f"no heartbeat for {quiet:.1f}s, and its host "
                                                f"does not answer ({view.detail})", True))
    return verdicts


def forming_due(step: Step, number: int) -> None:
    """Round `number` has not settled (some member has not joined, built its group or
    synced): the laggards' hosts are asked, first FORMING_FIRST_S after its first join, then
    at doubling intervals, as long as the collective timeout (the usual bounds then)."""
    state = step.state
    current = state.round
    if current is None or current.settled or not _current(step, number):
        return
    workers = state.workers
    laggards = sorted(wid for wid in current.member_ids - current.synced
                      if (w := workers.get(wid)) is not None and w.alive)
    if laggards:
        step.emit(InspectWorkers(number, tuple(laggards)))
    waited = step.now - current.opened_at
    if laggards and waited < step.config.collective_timeout:
        step.timer(TimerKind.FORMING, step.now + max(1.0, waited), round=number)


def probe_due(step: Step, number: int) -> list[Verdict]:
    state, now, config = step.state, step.now, step.config
    stall = state.stall
    if stall is None or stall.round != number:
        return []
    if not _watching(step, number) or now - stall.last_report > STALL_LAPSE_S:
        step.log("debug", f"round {number}: the stall is over")
        state.stall = None
        return []
    verdicts = []
    members = _members(step)
    silent = sorted(members - stall.answered)
    for worker_id in silent:
        view = stall.views.get(worker_id)
        quiet = now - stall.heard.get(worker_id, stall.started)
        if view is not None and view.state is ProcessState.UNKNOWN \
                and quiet >= config.hang_timeout:  # its host was asked, and cannot tell
            verdicts.append(Verdict(state.workers[worker_id], f"no heartbeat for {quiet:.1f}s"))
    stalled_for = now - stall.started
    for worker_id, left_at in stall.outside.items():
        cpu = stall.cpu.get(worker_id)
        if cpu is None or worker_id not in members:
            continue
        outside_for, idle_for = now - left_at, now - cpu[1]
        if min(outside_for, idle_for, stalled_for) >= config.stuck_timeout:
            verdicts.append(Verdict(
                state.workers[worker_id],
                f"stuck outside collectives for {outside_for:.1f}s (its training thread used "
                f"no CPU for {idle_for:.1f}s) while its peers waited"))
    if verdicts:
        return verdicts
    if silent:
        step.emit(InspectWorkers(number, tuple(silent)))
    if now >= stall.next_probe:
        _probe(step, stall)
    else:  # the next probe's time: the answers to this one are in
        step.timer(TimerKind.PROBE, stall.next_probe, round=number)
    return []


def _probe(step: Step, stall: Stall) -> None:
    """Asks every member; their answers are looked at PROBE_S later."""
    state = step.state
    state.probe_seq += 1
    stall.probe = state.probe_seq
    stall.answered = set()
    every = max(PROBE_EVERY_S, PROBE_PER_MEMBER_S * len(_members(step)))
    stall.next_probe = step.now + every
    step.emit(ProbeRound(stall.round, stall.probe))
    step.timer(TimerKind.PROBE, step.now + PROBE_S, round=stall.round)


def _members(step: Step) -> set[str]:
    current = step.state.round
    workers = step.state.workers
    return set() if current is None else {
        wid for wid in current.member_ids if (w := workers.get(wid)) is not None and w.alive}


def _current(step: Step, number: int) -> bool:
    """Whether round `number` is the current, unbroken round, hang detection on."""
    state = step.state
    current = state.round
    return step.config.hang_detection and current is not None and current.number == number \
        and state.broken_round < number \
        and state.phase in (JobPhase.RUNNING, JobPhase.FINISHING)


def _watching(step: Step, number: int, worker_id: str | None = None) -> bool:
    """Whether round `number` is the current, complete (or plain: its scripts never join),
    unbroken round (and `worker_id` one of its live members)."""
    current = step.state.round
    if current is None or not _current(step, number) \
            or not (current.complete or restarts.plain(step.state)):
        return False
    if worker_id is None:
        return True
    worker = step.state.workers.get(worker_id)
    return worker is not None and worker.alive and worker_id in current.member_ids
