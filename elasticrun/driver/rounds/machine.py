"""Pure: the round machine — every decision about rounds, failures and hosts.

`RoundMachine.handle(event, now)` changes the job's state (state.py) and returns the actions
the driver carries out. No asyncio, no I/O, no clock: time comes in as `now`, timers go out
as actions and come back as TimerFired events.

    STARTING --enough hosts--> RECOVERING --round cut--> RUNNING
    RUNNING --a member failed / reset asked--> RECOVERING --round cut--> RUNNING
    RUNNING --a plain round's member failed--> RECOVERING (its members stopped: restarts.py)
    RECOVERING --short of --min-np--> (waits, up to --elastic-timeout)
    RUNNING --a member exited 0--> FINISHING --all members exited 0--> STOPPED
    (resumed from the journal) --its workers back, or the bound--> as it was (resume.py)
    any --failure / interrupt / limit--> STOPPED
"""

from __future__ import annotations

import random
from collections.abc import Callable

from elasticrun.discovery.parsing import format_hosts
from elasticrun.driver.hosts.registry import HostRegistry
from elasticrun.driver.rounds import (
    cutting,
    growth,
    joins,
    liveness,
    restarts,
    resume,
    slot_failures,
    stragglers,
    total_loss,
)
from elasticrun.driver.rounds.assignment import SlotId
from elasticrun.driver.rounds.events import (
    Action,
    Event,
    HostsAdded,
    HostsDrained,
    HostsFound,
    InitCalled,
    Interrupted,
    JobResumed,
    JobStarted,
    JoinAsked,
    ProbeAnswered,
    ProcessesInspected,
    SpawnFailed,
    StopWorkers,
    TimerFired,
    TimerKind,
    WorkerBack,
    WorkerExited,
    WorkerFailing,
    WorkerPaced,
    WorkerStalled,
    WorkerStarted,
    WorkerSynced,
    WorkerTrained,
)
from elasticrun.driver.rounds.exits import describe_exit, exit_kind
from elasticrun.driver.rounds.state import JobPhase, JobState, WorkerRecord, WorkerStatus
from elasticrun.driver.rounds.step import Step
from elasticrun.job.config import DriverConfig


class RoundMachine:
    def __init__(self, config: DriverConfig, new_worker_id: Callable[[SlotId], str],
                 rng: random.Random | None = None, elastic_scripts: bool = False) -> None:
        """`elastic_scripts`: the job's script is known to call er.init() (its text calls
        it: processes/script_kind.py), so no round of it is in restart mode."""
        self.config = config
        self.state = JobState(HostRegistry(config.blacklist_cooldown, rng),
                              elastic_scripts=elastic_scripts)
        self._new_worker_id = new_worker_id

    def handle(self, event: Event, now: float) -> list[Action]:
        step = Step(self.state, self.config, now, self._new_worker_id)
        if step.stopped:
            return []
        if isinstance(event, JoinAsked):  # the most frequent event first
            joins.asked(step, event)
        elif isinstance(event, WorkerSynced):
            joins.synced(step, event.worker, event.round)
            if event.restored is not None:
                total_loss.restored(step, event.round, *event.restored)
            self.state.restoring = False  # a member holds the state now
            if self.state.sync_grace_until is not None:
                cutting.cut(step)
        elif isinstance(event, WorkerExited):
            _after_exit(step, _worker_exited(step, event))
        elif isinstance(event, WorkerFailing):
            _worker_failing(step, event)
        elif isinstance(event, TimerFired):
            _timer_fired(step, event)
        elif isinstance(event, ProbeAnswered):
            liveness.answered(step, event)
        elif isinstance(event, WorkerPaced):
            stragglers.paced(step, event)
        elif isinstance(event, WorkerStalled):
            liveness.stalled(step, event)
        elif isinstance(event, ProcessesInspected):
            _hung(step, liveness.inspected(step, event))
        elif isinstance(event, HostsFound) and self.state.resume is not None:
            _resume_decided(step, resume.hosts_found(step, event.hosts))
        elif isinstance(event, (HostsFound, JobStarted)):
            _hosts_found(step, event)
        elif isinstance(event, WorkerBack):
            _resume_decided(step, resume.back(step, event.worker))
        elif isinstance(event, JobResumed):
            _resume_decided(step, resume.started(step, event))
        elif isinstance(event, HostsDrained):
            _hosts_drained(step, event.hosts)
        elif isinstance(event, HostsAdded):
            for host in event.hosts:
                self.state.hosts.undrain(host)
        elif isinstance(event, WorkerStarted):
            _worker_started(step, event.worker)
        elif isinstance(event, SpawnFailed):
            _spawn_failed(step, event)
            _after_exit(step)
        elif isinstance(event, WorkerTrained):
            slot_failures.trained(step, event.worker)
        elif isinstance(event, InitCalled):
            self.state.elastic_scripts = True
        elif isinstance(event, Interrupted):
            step.log("warning", f"received {event.signal_name}; stopping the job")
            step.finish(event.code)
        return step.actions


def _hosts_found(step: Step, event: HostsFound | JobStarted) -> None:
    state = step.state
    if isinstance(event, JobStarted):
        state.hosts.update(event.hosts)
        step.timer(TimerKind.START_DEADLINE, step.now + step.config.start_timeout)
    elif event.hosts != state.hosts.discovered:
        old = state.hosts.discovered
        step.log("info", f"hosts now: {format_hosts(event.hosts) or 'none'}")
        state.hosts.update(event.hosts)
        step.report("hosts_changed", old=old, new=dict(event.hosts))
    if state.phase is JobPhase.STARTING:
        cutting.try_start(step, waited_out=False)
    else:
        _hosts_changed(step)


def _resume_decided(step: Step, held: dict[str, int] | None) -> None:
    """A resumed driver decided about its workers: discovery's held answer applies now."""
    if held is not None and not step.stopped:
        _hosts_found(step, HostsFound(held))


def _hosts_changed(step: Step) -> None:
    """The usable hosts may differ: a round waiting for slots retries; otherwise the next
    round's standbys are prepared."""
    if step.state.capacity_deadline is not None:
        cutting.cut(step)
    else:
        growth.plan(step)


def _hosts_drained(step: Step, hosts: tuple[str, ...]) -> None:
    registry = step.state.hosts
    for host in hosts:
        if host in registry.discovered and host not in registry.drained:
            registry.drain(host)
            step.report("host_drained", host=host)
            step.log("warning", f"host {host} drained: its workers leave at the next commit")
    _hosts_changed(step)


def _worker_started(step: Step, worker_id: str) -> None:
    worker = step.state.workers.get(worker_id)
    if worker is None:
        return
    worker.started_at = step.now
    if worker.status is WorkerStatus.STOPPING:
        step.emit(StopWorkers((worker_id,)))  # its host failed while it was being started
    elif worker.standby:
        growth.standby_started(step, worker)


def _spawn_failed(step: Step, event: SpawnFailed) -> None:
    worker = step.state.workers.get(event.worker)
    if worker is None:
        return
    worker.alive = False
    worker.status = WorkerStatus.FAILED
    _forget(step, worker.id)
    cause = f"{event.error} (on host {worker.slot.host})"
    step.record_failure(worker, cause, "spawn_error", rank=None)
    if restarts.applies(step.state, worker):
        restarts.failed(step, cause, "spawn_error")
    step.fail_host(worker.slot.host, event.error)


def _after_exit(step: Step, gone: WorkerRecord | None = None) -> None:
    """A worker is gone: the new worker waiting for its slot starts, a restart waiting for
    its round's members may go on, and so may a cut waiting for sync reports (with no worker
    alive, none can come). A failed standby's slot gets a new one (a member's: at the cut)."""
    state = step.state
    if step.stopped:
        return
    slot_failures.vacated(step)
    waiting_for_reports = state.sync_grace_until is not None
    if restarts.all_gone(state, step.now) or state.unrecoverable is not None or (
            waiting_for_reports and not any(w.alive for w in state.workers.values())):
        cutting.cut(step)
    if gone is not None and gone.status is WorkerStatus.FAILED and not state.is_member(gone.id):
        state.workers.pop(gone.id, None)  # nothing refers to it any more (a cut may have
        growth.plan(step)  # forgotten it already); its slot gets a new standby


def _worker_exited(step: Step, event: WorkerExited) -> WorkerRecord | None:
    """Returns the worker that is gone (None: unknown, or gone already)."""
    state = step.state
    worker = state.workers.get(event.worker)
    if worker is None or not worker.alive:
        return None
    worker.alive = False
    _forget(step, worker.id)
    code = event.code
    if worker.status is WorkerStatus.FAILED:
        step.log("debug", f"worker {worker.slot} ended after its own error "
                          f"({describe_exit(code)})")
        return worker
    if worker.status in (WorkerStatus.RELEASED, WorkerStatus.STOPPING):
        step.log("debug", f"worker {worker.slot} ended after being stopped or released "
                          f"({describe_exit(code)})")
        if worker.status is WorkerStatus.STOPPING:
            restarts.died_while_stopping(step, worker, code)
        _finish_if_done(step)
        return worker
    if code == 0:
        worker.status = WorkerStatus.FINISHED
        if state.is_member(worker.id):
            state.phase = JobPhase.FINISHING
        _finish_if_done(step)
        return worker
    worker.status = WorkerStatus.FAILED
    if event.host_lost and restarts.applies(state, worker):
        restarts.lost_with_host(step, worker, code)
        return worker
    cause = f"rank {worker.rank} on host {worker.slot.host} {describe_exit(code)}"
    step.record_failure(worker, cause, exit_kind(code), rank=worker.rank, exit_code=code)
    if event.host_lost:  # its agent went away: the host is lost, not only this worker
        step.fail_host(worker.slot.host, f"{cause} with its host's agent")
    else:
        _failed(step, worker, cause, exit_kind(code))
    return worker


def _worker_failing(step: Step, event: WorkerFailing) -> None:
    """Its own error ends a worker: the same as its failed exit, but known before it is
    through its teardown, so its round breaks now. It is left to print its error and exit
    (it is not stopped: a signal could cut its traceback off)."""
    worker = step.state.workers.get(event.worker)
    if worker is None or not worker.alive or worker.status is not WorkerStatus.RUNNING:
        return
    worker.status = WorkerStatus.FAILED
    _forget(step, worker.id)
    cause = f"rank {worker.rank} on host {worker.slot.host} failed: {event.failure}"
    step.record_failure(worker, cause, "exception", rank=worker.rank)
    if event.unrecoverable and step.state.unrecoverable is None:
        step.state.unrecoverable = (worker.id, cause)  # a restart would fail the same way
    _failed(step, worker, cause, "exception")


def _hung(step: Step, verdicts: list[liveness.Verdict]) -> None:
    """Hung workers are killed at once (one that woke up later must not act in a later
    round) and fail as a failed exit does. A host that does not answer fails too: it can
    neither be stopped nor used."""
    for verdict in verdicts:
        worker = verdict.worker
        if not worker.alive or worker.status is not WorkerStatus.RUNNING:
            continue
        worker.status = WorkerStatus.FAILED
        _forget(step, worker.id)
        step.state.stall = None
        step.emit(StopWorkers((worker.id,), kill=True))
        cause = f"rank {worker.rank} on host {worker.slot.host} hung: {verdict.reason}"
        step.record_failure(worker, cause, "hang", rank=worker.rank)
        _failed(step, worker, cause, "hang")
        if verdict.unreachable:
            step.fail_host(worker.slot.host, cause)


def _failed(step: Step, worker: WorkerRecord, cause: str, kind: str) -> None:
    if restarts.applies(step.state, worker):
        restarts.failed(step, cause, kind)
        slot_failures.blame(step, worker, cause)
    elif step.state.phase is JobPhase.FINISHING:
        step.fail(f"{cause} after other workers had finished")
    else:
        slot_failures.failed(step, worker, cause)


def _forget(step: Step, worker_id: str) -> None:
    state = step.state
    state.waiting_joins.pop(worker_id, None)
    state.growth.ids.discard(worker_id)
    state.growth.ready.discard(worker_id)
    stragglers.forget(step, worker_id)


def _finish_if_done(step: Step) -> None:
    current = step.state.round
    if current is None or not current.member_ids:
        return
    workers = step.state.workers
    if all((w := workers.get(wid)) is not None and w.status is WorkerStatus.FINISHED
           for wid in current.member_ids):
        step.log("info", f"all {len(current.member_ids)} worker(s) of round "
                         f"{current.number} finished")
        step.finish(0)


def _timer_fired(step: Step, event: TimerFired) -> None:
    state, timer = step.state, event.timer
    kind = timer.kind
    if kind is TimerKind.CUT_ROUND:
        if state.cut_at is not None and step.now >= state.cut_at:
            cutting.cut(step)
    elif kind is TimerKind.START_DEADLINE:
        cutting.try_start(step, waited_out=True)
    elif kind is TimerKind.LAST_CALL:
        cutting.try_start(step, waited_out=False)
    elif kind is TimerKind.CAPACITY_DEADLINE:
        if state.capacity_deadline is not None:
            cutting.cut(step)
    elif kind is TimerKind.SYNC_REPORTS_DUE:
        if state.sync_grace_until is not None:
            cutting.cut(step)
    elif kind in (TimerKind.CHECK_IN, TimerKind.REJOIN):
        joins.check_in_expired(step, timer.round, survivors=kind is TimerKind.REJOIN)
    elif kind is TimerKind.UNJOINED:
        joins.nobody_joined(step, timer.round)
    elif kind is TimerKind.HOLD_LEAVING:
        joins.reevaluate(step)
    elif kind is TimerKind.PROBE:
        _hung(step, liveness.probe_due(step, timer.round))
    elif kind is TimerKind.FORMING:
        liveness.forming_due(step, timer.round)
    elif kind is TimerKind.RESUME_BOUND:
        _resume_decided(step, resume.bound_passed(step))
    elif kind is TimerKind.RESTART_STOPPED:
        restarts.stop_deadline(step)
        _after_exit(step)
    elif kind is TimerKind.STANDBY_DEADLINE:
        growth.standby_deadline(step, timer.worker)
    elif kind is TimerKind.COOLDOWN_END and timer.slot >= 0:
        if not state.hosts.slot_blacklisted(timer.host, timer.slot, step.now):
            step.log("info", f"slot {SlotId(timer.host, timer.slot)}: blacklist cooldown "
                             f"ended")
            step.report("slot_restored", host=timer.host, slot=timer.slot)
            _hosts_changed(step)
    elif kind is TimerKind.COOLDOWN_END:
        if not state.hosts.is_blacklisted(timer.host, step.now):
            step.log("info", f"host {timer.host}: blacklist cooldown ended")
            step.report("host_restored", host=timer.host)
            _hosts_changed(step)
    elif kind is TimerKind.VACATE:
        slot_failures.vacate_due(step, timer.worker)
