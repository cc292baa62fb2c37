"""Pure: starting the job and cutting the next round — who is in it, or why there is none.

A cut waits (in named states, with timers) for what it needs: --min-np slots (up to
--elastic-timeout), and, when no live worker seems to hold the committed state, for sync
reports still in flight. When every holder of the committed state is lost, the next round
restarts from the kept commit (total_loss.py). It refuses, with one message, when the reset
limit is spent, when a total loss cannot be restarted, or when rounds keep resetting on the
same failure with no commit in between.
"""

from __future__ import annotations

from elasticrun.discovery.parsing import format_hosts
from elasticrun.driver.rounds import (
    growth,
    joins,
    planner,
    replica_groups,
    restarts,
    slot_failures,
    total_loss,
)
from elasticrun.driver.rounds.actions import OpenRound, Spawn, TimerKind
from elasticrun.driver.rounds.assignment import Assignment, SlotId
from elasticrun.driver.rounds.capacity import shortfall, start_refusal
from elasticrun.driver.rounds.state import JobPhase, Round, WorkerRecord, WorkerStatus
from elasticrun.driver.rounds.step import Step

# Workers report a completed sync just before a failure can make the driver think that no
# live worker holds the committed state; their reports get this long to arrive.
SYNC_REPORT_WAIT_S = 2.0
# This many rounds in a row ended by a failure that no lost worker explains, with no commit
# in between: the same failure over and over, and the job stops instead of resetting forever.
STORM_LIMIT = 10


def try_start(step: Step, waited_out: bool) -> None:
    state, config = step.state, step.config
    if state.phase is not JobPhase.STARTING:
        return
    replica_groups.note_left_over(step)
    available = sum(len(slots) for slots in
                    planner.usable_slots(state, config.shard_size, step.now).values())
    refusal = start_refusal(config, available, state.hosts, waited_out)
    if refusal is not None:
        step.fail(refusal)
    elif available >= config.np and _last_call(step, available):
        return
    elif available >= config.np or waited_out or not config.dynamic_hosts:
        state.phase = JobPhase.RECOVERING
        cut(step)


def _last_call(step: Step, available: int) -> bool:
    """torchrun's last call (--rdzv-conf last_call_timeout): once -np slots are there, the
    first round waits that long for more, up to --max-np, before it starts. True: wait."""
    state, config = step.state, step.config
    if config.last_call is None or (config.max_np is not None and available >= config.max_np):
        return False
    if state.last_call_until is None:
        state.last_call_until = step.now + config.last_call
        step.timer(TimerKind.LAST_CALL, state.last_call_until)
        step.log("info", f"{available} slot(s) joined; the first round waits up to "
                         f"{config.last_call:g}s for more (--rdzv-conf last_call_timeout)")
    return step.now < state.last_call_until


def cut(step: Step) -> None:
    """Opens the next round if it can be opened now; otherwise waits or fails."""
    state, config, now = step.state, step.config, step.now
    if state.phase in (JobPhase.FINISHING, JobPhase.STOPPED, JobPhase.STARTING):
        return
    if state.resume is not None and not state.resume.decided:
        return  # a resumed driver cuts once it knows who is back (resume.py cuts then)
    state.cut_at = None
    state.phase = JobPhase.RECOVERING
    if state.unrecoverable is not None:
        worker_id, cause = state.unrecoverable
        worker = state.workers.get(worker_id)
        if worker is None or not worker.alive:  # (alive: its exit cuts again, worker_ends.py)
            step.fail(f"{cause}; the job cannot go on from its committed state")
        return
    if restarts.hold(step):
        return  # a plain round's members are being stopped: the next round follows them
    if not restarts.settle(step):
        return  # --max-restarts spent: the job ended
    # A total loss that can be restarted is decided before the slots are counted: it gives
    # hosts back. With nothing kept, the slots come first, as they always did.
    restoring = total_loss.can_restore(step)
    if restoring and planner.state_lost(state, now):
        if _awaiting_sync_reports(step) or not total_loss.restart(step):
            return
    replica_groups.note_left_over(step)
    capacity = planner.capacity(state, config.max_np, config.shard_size, now)
    if capacity < config.min_np:
        _short_of_slots(step, capacity)
        return
    target = _without_refills(step, planner.desired(state, config.max_np, config.shard_size,
                                                   now))
    state.capacity_deadline = None
    if not restoring and planner.state_lost(state, now):
        if not _awaiting_sync_reports(step):
            total_loss.restart(step)  # (nothing kept: it ends the job, saying so)
        return
    state.sync_grace_until = None
    number = state.round_number + 1
    limit = config.reset_limit
    if number > 1 and limit is not None and number - 1 > limit:
        step.fail(f"reset limit {limit} reached: another reset was needed")
        return
    if _storming(step):
        return
    _open(step, number, target)


def _without_refills(step: Step, target: Assignment) -> Assignment:
    """`target` without the slots that need a new worker (or whose standby is still
    starting), when the workers ready meet --min-np without them: the survivors go on at
    once, and the new workers start while they train and join at a commit (growth.py),
    rather than hold everybody at the rendezvous while they start. The first round, a
    restart, and a round short of --min-np without them take them at once."""
    state, config = step.state, step.config
    if state.round is None or state.restoring or restarts.plain(state):
        return target
    ready = {slot for slot, w in state.holders().items() if not w.standby or w.checked_in}
    refills = frozenset(slot for slot in target if slot not in ready)
    if not refills:
        return target
    without = planner.without(target, refills)
    return without if without and len(without) >= config.min_np else target


def _awaiting_sync_reports(step: Step) -> bool:
    """No live worker seems to hold the committed state: True while reports of workers that
    synced just before the failure may still be in flight (none can be once no worker that
    joined a round is alive: a new worker still starting, a slot's refill, never synced)."""
    state, now = step.state, step.now
    anyone_alive = any(w.alive and w.joined_round > 0 for w in state.workers.values())
    if state.sync_grace_until is None and anyone_alive:
        state.sync_grace_until = now + SYNC_REPORT_WAIT_S
        step.timer(TimerKind.SYNC_REPORTS_DUE, state.sync_grace_until)
    if state.sync_grace_until is not None and now < state.sync_grace_until and anyone_alive:
        return True
    state.sync_grace_until = None
    return False


def _short_of_slots(step: Step, slots: int) -> None:
    state, config, now = step.state, step.config, step.now
    short = shortfall(config, slots, state.hosts, now, slot_failures.trained_ever(step))
    if short.hopeless is not None:
        step.fail(f"no progress possible: {short.hopeless}")
        return
    if state.capacity_deadline is None:
        state.capacity_deadline = now + config.elastic_timeout
        step.timer(TimerKind.CAPACITY_DEADLINE, state.capacity_deadline)
        step.log("warning", f"waiting up to {config.elastic_timeout:g}s (--elastic-timeout) "
                            f"for {config.min_np} slot(s); {slots} available")
    elif now >= state.capacity_deadline:
        hosts = format_hosts(state.hosts.discovered) or "none"
        step.fail(f"elastic timeout: waited {config.elastic_timeout:g}s (--elastic-timeout) "
                  f"for --min-np {config.min_np} slot(s), but only {slots} are available "
                  f"(hosts: {hosts})")


def _storming(step: Step) -> bool:
    """Counts rounds ended by failures that nothing explains; True when the job stops."""
    state = step.state
    previous = state.round
    if previous is None:
        return False
    failures = [r for r in state.resets.values() if r.failure]
    committed = any(r.committed for r in state.resets.values())
    if not failures or committed or previous.worker_lost:
        state.storm.clear()
        return False
    first = failures[0]
    state.storm.count += 1
    state.storm.culprits[(first.rank, first.host, first.failure)] += 1
    if state.storm.count < STORM_LIMIT:
        return False
    (rank, host, failure), _ = state.storm.culprits.most_common(1)[0]
    step.fail(f"rounds keep resetting without progress: {state.storm.count} rounds in a row "
              f"ended by a failure with no commit in between and no worker lost; rank {rank} "
              f"on host {host} keeps failing: {failure}")
    return True


def _open(step: Step, number: int, target: Assignment) -> None:
    state = step.state
    holders = state.holders()
    occupants = {w.slot: w for w in state.workers.values() if w.alive}
    members: dict[SlotId, str] = {}
    new_slots: list[SlotId] = []
    for slot in target:
        holder = holders.get(slot)
        if holder is not None:
            members[slot] = holder.id
        else:
            members[slot] = step.new_worker_id(slot)
            new_slots.append(slot)
    state.round = Round(number, dict(target), members, state.notice_seq, step.now)
    state.phase = JobPhase.RUNNING
    state.restart = None
    state.resets.clear()
    state.growth.clear()
    for worker_id in [w.id for w in state.workers.values()
                      if not w.alive and w.id not in state.round.member_ids]:
        del state.workers[worker_id]  # gone for good: nothing refers to it any more
    for worker in state.workers.values():
        if worker.standby and worker.alive and worker.status is WorkerStatus.RUNNING \
                and worker.id not in state.round.member_ids:
            state.growth.ids.add(worker.id)  # still starting: it joins a later round
            if worker.checked_in:
                state.growth.ready.add(worker.id)
        else:
            worker.standby = False  # standbys are members now, or have no place
    for slot in new_slots:
        worker = WorkerRecord(members[slot], slot, target[slot].rank)
        state.workers[worker.id] = worker
    step.emit(OpenRound(number, target, len(new_slots)))
    step.report("round_opened", number=number, assignment=target)
    per_host: dict[str, int] = {}
    for slot in sorted(target, key=lambda s: target[s].rank):
        per_host[slot.host] = per_host.get(slot.host, 0) + 1
    new = f" ({len(new_slots)} new worker(s))" if number > 1 and new_slots else ""
    step.log("info", f"round {number}: world size {len(target)} on {format_hosts(per_host)}{new}")
    for slot in new_slots:
        step.spawn(Spawn(members[slot], slot, target, standby=False, round=number,
                         restarts=state.restarts, restore=state.restoring),
                   occupants.get(slot))
    joins.opened(step)
    joins.reevaluate(step)
    growth.plan(step)
