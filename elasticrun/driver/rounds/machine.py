"""Pure: the round machine — every decision about rounds, failures and hosts.

`RoundMachine.handle(event, now)` changes the job's state (state.py) and returns the actions
the driver carries out. No asyncio, no I/O, no clock: time comes in as `now`, timers go out
as actions and come back as TimerFired events. A worker's end (its exit, its own error, a
hang, a failed spawn) is taken in worker_ends.py.

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
    worker_ends,
)
from elasticrun.driver.rounds.actions import Action, StopWorkers, TimerKind
from elasticrun.driver.rounds.assignment import SlotId
from elasticrun.driver.rounds.events import (
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
    TimerFired,
    WorkerBack,
    WorkerExited,
    WorkerFailing,
    WorkerPaced,
    WorkerStalled,
    WorkerStarted,
    WorkerSynced,
    WorkerTrained,
)
from elasticrun.driver.rounds.state import JobPhase, JobState, WorkerStatus
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
            worker_ends.after_exit(step, worker_ends.exited(step, event))
        elif isinstance(event, WorkerFailing):
            worker_ends.failing(step, event)
        elif isinstance(event, TimerFired):
            _timer_fired(step, event)
        elif isinstance(event, ProbeAnswered):
            liveness.answered(step, event)
        elif isinstance(event, WorkerPaced):
            stragglers.paced(step, event)
        elif isinstance(event, WorkerStalled):
            liveness.stalled(step, event)
        elif isinstance(event, ProcessesInspected):
            worker_ends.hung(step, liveness.inspected(step, event))
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
            worker_ends.spawn_failed(step, event)
            worker_ends.after_exit(step)
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
        worker_ends.hung(step, liveness.probe_due(step, timer.round))
    elif kind is TimerKind.FORMING:
        liveness.forming_due(step, timer.round)
    elif kind is TimerKind.RESUME_BOUND:
        _resume_decided(step, resume.bound_passed(step))
    elif kind is TimerKind.RESTART_STOPPED:
        restarts.stop_deadline(step)
        worker_ends.after_exit(step)
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
