"""Pure: growing while training goes on — the next round's new workers start as standbys.

When the hosts would give a different round, the workers it needs are started at once while
the current round keeps training. Only when every one of them has checked in is the current
round told (a notice) to make room at its next commit, so training pauses for the rendezvous
and the sync, not for the newcomers' interpreter and torch start-up.

Discovery is the truth, as in Horovod Elastic: when the hosts it lists have fewer slots than
--min-np, the round is told at once; it stops at its next commit, and the next round waits
(cutting.py) up to --elastic-timeout for capacity. The workers on hosts that are gone are
kept until then, holding the committed state: a host that comes back is used again.
"""

from __future__ import annotations

from elasticrun.driver.rounds import planner, replica_groups, restarts, slot_failures
from elasticrun.driver.rounds.actions import PostNotice, Spawn, StopWorkers, TimerKind
from elasticrun.driver.rounds.assignment import Assignment
from elasticrun.driver.rounds.state import JobPhase, WorkerRecord, WorkerStatus
from elasticrun.driver.rounds.step import Step
from elasticrun.protocol import HostUpdateResult


def plan(step: Step) -> None:
    """Moves towards the round the hosts give now: stops unwanted standbys, starts missing
    ones, and notifies the current round once all are ready."""
    state, config = step.state, step.config
    current = state.round
    if state.phase is not JobPhase.RUNNING or current is None:
        return  # a round is being cut: it will take the hosts as they are
    growth = state.growth
    replica_groups.note_left_over(step)
    capacity = planner.capacity(state, config.max_np, config.shard_size, step.now)
    if restarts.plain(state):  # no standbys: the round starts over on the new hosts
        if capacity < config.min_np or not _same_slots(planner.desired(
                state, config.max_np, config.shard_size, step.now), current.assignment):
            step.request_cut(0.0)
        return
    if capacity < config.min_np:
        _short_of_slots(step, capacity)
        return
    target = planner.desired(state, config.max_np, config.shard_size, step.now)
    unwanted = [w for wid in growth.ids if (w := state.workers.get(wid)) is not None
                and w.slot not in target]
    step.stop_workers(unwanted)
    if _same_slots(target, current.assignment):
        growth.target = None
        return
    growth.target = target
    holders = state.holders()
    missing = [slot for slot in target if slot not in holders]
    if missing:
        step.log("info", f"starting {len(missing)} worker(s) for the next round while "
                         f"training continues")
    occupants = {w.slot: w for w in state.workers.values() if w.alive} if missing else {}
    for slot in missing:
        worker = WorkerRecord(step.new_worker_id(slot), slot, target[slot].rank, standby=True)
        state.workers[worker.id] = worker
        growth.ids.add(worker.id)
        step.spawn(Spawn(worker.id, slot, target, standby=True, round=current.number + 1,
                         restarts=state.restarts), occupants.get(slot))
    notify_if_ready(step)


def _same_slots(target: Assignment, current: Assignment) -> bool:
    """Whether `target` is the current round over again. Ranks alone never make a new round:
    while a round's members report their syncs, the holders-first order of the round the
    hosts give can differ from the current one for a moment, and no training should stop
    for that."""
    return target.keys() == current.keys()


def _short_of_slots(step: Step, capacity: int) -> None:
    """Discovery lists fewer than --min-np slots: no round can be formed on these hosts.
    Standbys stop; the round is told (once) to stop at its next commit."""
    state, config = step.state, step.config
    growth = state.growth
    step.stop_workers([w for wid in growth.ids if (w := state.workers.get(wid)) is not None])
    growth.target = {}
    if growth.notified == {}:
        return
    step.log("warning", f"hosts changed: {capacity} slot(s) available, fewer than --min-np "
                        f"{config.min_np}; the workers stop at their next commit and the job "
                        f"waits up to {config.elastic_timeout:g}s (--elastic-timeout) for "
                        f"more")
    notify_if_ready(step)


def checked_in(step: Step, worker: WorkerRecord) -> None:
    if worker.checked_in:
        return
    worker.checked_in = True
    if worker.id in step.state.growth.ids:
        step.state.growth.ready.add(worker.id)
        notify_if_ready(step)


def standby_started(step: Step, worker: WorkerRecord) -> None:
    step.timer(TimerKind.STANDBY_DEADLINE, step.now + step.config.init_timeout,
               worker=worker.id)


def standby_deadline(step: Step, worker_id: str) -> None:
    """A standby that has not called er.init() within --init-timeout fails (stopped), as
    any worker that misses its bound."""
    state = step.state
    worker = state.workers.get(worker_id)
    if step.stopped or worker is None or not worker.alive \
            or worker_id not in state.growth.ids or worker_id in state.growth.ready:
        return
    cause = (f"a new worker in slot {worker.slot} did not call er.init() within "
             f"{step.config.init_timeout:g}s (--init-timeout)")
    step.record_failure(worker, cause, "check_in_timeout", rank=None)
    state.growth.ids.discard(worker.id)
    worker.status = WorkerStatus.FAILED
    step.emit(StopWorkers((worker.id,), kill=True))
    slot_failures.failed(step, worker, cause)


def notify_if_ready(step: Step) -> None:
    state = step.state
    growth = state.growth
    target = growth.target
    if target is None or target == growth.notified or not growth.ids <= growth.ready:
        return
    growth.notified = target
    state.notice_seq += 1
    step.emit(PostNotice(state.notice_seq, update(state.assignment, target)))
    if target:
        step.log("info", f"next round will have world size {len(target)}; "
                         f"notified workers (notice {state.notice_seq})")


def update(current: Assignment, target: Assignment) -> HostUpdateResult:
    """What a notice announces: slots the next round removes, adds, or both."""
    result = HostUpdateResult.no_update
    if any(slot not in target for slot in current):
        result |= HostUpdateResult.removed
    if any(slot not in current for slot in target):
        result |= HostUpdateResult.added
    return result
