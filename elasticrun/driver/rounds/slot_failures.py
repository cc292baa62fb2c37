"""Pure: a worker that fails leaves a hole in its slot, not in its host.

A worker that exits non-zero, is killed, raises, is found hung or misses its bound fails
alone: its host's other workers go on (the survivors roll back in-process), and its slot
gets a new worker, forked from the host's worker template. The cut decides when it joins
(cutting.py): at the next commit when the survivors are enough for --min-np (it starts
while they train), at the rendezvous otherwise (they wait for it). With --shard-size S,
the unit is the worker's replica group: its peers are stopped, and the group is refilled
whole.

Whom a failure blames is evidence.py's: nobody (the slot is refilled), the slot (it is
blacklisted alone, with the hosts' cooldowns) or the host (Step.fail_host, as a host that
does not answer is failed). A slot or host whose workers keep failing while the job cannot
train without it ends the job. A torchrun-style round restarts whole instead (restarts.py),
but its failures are charged the same way.

A refill never starts while the slot's failed worker still runs (exiting after its error,
or being stopped): its start waits for that exit (Step.spawn), at most VACATE_WAIT_S, when
the old one is killed.
"""

from __future__ import annotations

from elasticrun.driver.rounds import evidence, planner, restarts
from elasticrun.driver.rounds.actions import StopWorkers, TimerKind
from elasticrun.driver.rounds.assignment import SlotId
from elasticrun.driver.rounds.evidence import Blame, Verdict
from elasticrun.driver.rounds.state import WorkerRecord
from elasticrun.driver.rounds.step import Step


def failed(step: Step, worker: WorkerRecord, cause: str) -> None:
    """`worker` failed on its own, in a round that recovers in-process (or outside any
    round: a standby). Its replica group leaves; a member's round is broken."""
    state = step.state
    verdict = blame(step, worker, cause)
    if verdict.blame is Blame.HOST or step.stopped:
        return  # its host failed: every worker there is stopped, the round broken
    group = set(replica_group(worker.slot, step.config.shard_size))
    peers = [w for w in state.live_on(worker.slot.host)
             if w.slot in group and w.id != worker.id]
    step.stop_workers(peers)
    if any(state.is_member(w.id) for w in (worker, *peers)):
        step.member_lost(worker.slot.host, cause)


def blame(step: Step, worker: WorkerRecord, cause: str) -> Verdict:
    """Charges the failure to the worker's slot and carries out the verdict: a slot (its
    replica group) blacklisted, or its host failed; the job ends on a crash loop."""
    state, now = step.state, step.now
    if restarts.plain(state):  # a torchrun-style member proves its work by running
        for other in state.workers.values():
            if (other.alive or other is worker) \
                    and evidence.ran_long_enough(other.started_at, now):
                evidence.worked(state.strikes, other.slot)
                state.trained = True
    slot = worker.slot
    verdict = evidence.charge(state.strikes, slot, cause)
    if restarts.plain(state) and not goes_on_without(step, slot, verdict.blame):
        # --max-restarts bounds a torchrun-style job's repeated failures, as under torchrun
        verdict = Verdict(Blame.NOBODY, verdict.strikes, verdict.slots)
    if verdict.blame is Blame.HOST:
        step.fail_host(slot.host, f"{cause}; its workers failed {verdict.strikes} times in a "
                                  f"row, on {verdict.slots} of its slots")
    elif verdict.blame is Blame.SLOT:
        _blacklist_slots(step, slot, cause, verdict.strikes)
    elif not restarts.plain(state):  # (a restart says so itself)
        again = f" (its failure {verdict.strikes} in a row)" if verdict.strikes > 1 else ""
        step.log("warning", f"{cause}; slot {slot} gets a new worker{again}")
    # A crash loop: every new worker fails. Before any worker of the job has worked, the
    # first blacklisting is one already (the set-up fails, not the machine).
    if evidence.crash_loop(verdict) or (verdict.blame is not Blame.NOBODY
                                        and not state.trained):
        capacity = planner.capacity(state, step.config.max_np, step.config.shard_size, now)
        if capacity < step.config.min_np:
            place = f"host {slot.host}" if verdict.blame is Blame.HOST else f"slot {slot}"
            step.fail(f"{place} keeps failing: {verdict.strikes} failures in a row, none of "
                      f"its workers reached a commit, and the job cannot go on without it "
                      f"({capacity} slot(s) left, --min-np {step.config.min_np}); last: "
                      f"{cause}")
    return verdict


def goes_on_without(step: Step, slot: SlotId, blame: Blame) -> bool:
    """Whether the job keeps --min-np slots without the slot (its replica group) or host
    `blame` would leave out."""
    if blame is Blame.NOBODY:
        return True
    config = step.config
    usable = planner.usable_slots(step.state, config.shard_size, step.now)
    if blame is Blame.HOST:
        lost = len(usable.get(slot.host, ()))
    else:
        lost = len(set(replica_group(slot, config.shard_size)) & {
            SlotId(slot.host, i) for i in usable.get(slot.host, ())})
    left = sum(len(indices) for indices in usable.values()) - lost
    return min(left, config.max_np if config.max_np is not None else left) >= config.min_np


def _blacklist_slots(step: Step, slot: SlotId, cause: str, strikes: int) -> None:
    """Leaves the slot's replica group out, with the hosts' cooldown schedule."""
    registry, now = step.state.hosts, step.now
    for member in replica_group(slot, step.config.shard_size):
        entry = registry.blacklist_slot(member.host, member.index, now)
        cooldown = None if entry.until is None else entry.until - now
        until = "permanently" if cooldown is None else f"for {cooldown:.1f}s"
        step.log("warning", f"slot {member} blacklisted {until}: {strikes} failures in a row, "
                            f"none of its workers reached a commit (last: {cause})")
        step.report("slot_blacklisted", host=member.host, slot=member.index, cause=cause,
                    cooldown_s=cooldown, failures=entry.failures)
        if entry.until is not None:
            step.timer(TimerKind.COOLDOWN_END, entry.until, host=member.host,
                       slot=member.index)
    step.state.failed_unsettled.add(slot.host)


def replica_group(slot: SlotId, shard_size: int) -> list[SlotId]:
    """The slots of `slot`'s replica group (itself alone without --shard-size)."""
    first = slot.index - slot.index % shard_size
    return [SlotId(slot.host, index) for index in range(first, first + shard_size)]


def trained(step: Step, worker_id: str) -> None:
    """A worker reached its first commit: its slot has worked, its failures are forgiven."""
    worker = step.state.workers.get(worker_id)
    step.state.trained = True
    if worker is not None and evidence.worked(step.state.strikes, worker.slot):
        step.log("debug", f"slot {worker.slot} works again: its failures are forgiven")


def trained_ever(step: Step) -> bool:
    """Whether some worker of the job has worked: reached a commit, or, a torchrun-style
    one, run evidence.WORKED_RUN_S."""
    state = step.state
    if not state.trained and restarts.plain(state):
        state.trained = any(w.alive and evidence.ran_long_enough(w.started_at, step.now)
                            for w in state.workers.values())
    return state.trained


def vacated(step: Step) -> None:
    """A worker is gone: the new workers that waited for its slot start now."""
    state = step.state
    if not state.deferred_spawns:
        return
    occupied = {w.slot for w in state.workers.values()
                if w.alive and w.id not in state.deferred_spawns}
    for worker_id, spawn in list(state.deferred_spawns.items()):
        if spawn.slot not in occupied:
            del state.deferred_spawns[worker_id]
            step.emit(spawn)


def vacate_due(step: Step, occupant_id: str) -> None:
    """A failed worker still holds a refill back after VACATE_WAIT_S: it is killed."""
    state = step.state
    occupant = state.workers.get(occupant_id)
    if occupant is None or not occupant.alive:
        return
    if any(spawn.slot == occupant.slot for spawn in state.deferred_spawns.values()):
        step.log("warning", f"worker {occupant.slot} has not exited after its failure; "
                            f"killing it so that its slot can be refilled")
        step.emit(StopWorkers((occupant.id,), kill=True))
