"""Pure: the next round's membership, from the usable hosts and the workers still alive.

Policy lives in assignment.py; this reads what it needs from the job's state: which members
of the current round survive, and which of them hold the committed training state.
"""

from __future__ import annotations

from elasticrun.driver.rounds.assignment import (
    Assignment,
    SlotId,
    assign,
    assign_keeping_state,
    hosts_in_rank_order,
    order_hosts,
)
from elasticrun.driver.rounds.replica_groups import whole_groups, whole_size
from elasticrun.driver.rounds.state import JobState, WorkerRecord, WorkerStatus


def usable_slots(state: JobState, shard_size: int, now: float) -> dict[str, tuple[int, ...]]:
    """The usable hosts' usable slots (none left out) that whole replica groups of
    `shard_size` fill."""
    return whole_groups(state.hosts.usable_slots(now), shard_size)


def desired(state: JobState, max_np: int | None, shard_size: int, now: float) -> Assignment:
    """The round the usable hosts give: hosts in their old order, survivors first. If no
    member holds the committed state but a leaving worker still does, it is kept."""
    usable = usable_slots(state, shard_size, now)
    ordered = order_hosts(hosts_in_rank_order(state.assignment), usable)
    holders = state.holders()
    alive = survivors(state, now, holders)
    keepers = alive
    if state.state_committed:  # once there is state to keep, only its holders can
        keepers = [slot for slot in alive if holders[slot].synced_round > 0] \
            or leaving_holders(state, now) or alive
    return assign_keeping_state([(host, usable[host]) for host in ordered],
                                whole_size(max_np, shard_size), alive, keepers,
                                shard_size=shard_size)


def without(assignment: Assignment, slots: frozenset[SlotId]) -> Assignment:
    """`assignment` less `slots` (whole replica groups), ranked again in the same order:
    hosts as they were, each keeping its other slots' indices."""
    per_host: dict[str, list[int]] = {}
    for slot in sorted(assignment, key=lambda s: assignment[s].rank):
        if slot not in slots:
            per_host.setdefault(slot.host, []).append(slot.index)
    return assign(list(per_host.items()))


def capacity(state: JobState, max_np: int | None, shard_size: int, now: float) -> int:
    """The slots discovery offers now (usable hosts, in whole replica groups, at most
    --max-np): what --min-np is compared with. A worker kept only to hand the state over
    does not count."""
    slots = sum(len(indices) for indices in usable_slots(state, shard_size, now).values())
    cap = whole_size(max_np, shard_size)
    return slots if cap is None else min(slots, cap)


def survivors(state: JobState, now: float,
              holders: dict[SlotId, WorkerRecord] | None = None) -> list[SlotId]:
    """Slots of the current round whose workers are alive, in rank order."""
    current = state.round
    if current is None:
        return []
    holders = state.holders() if holders is None else holders
    return [slot for slot, _ in sorted(current.assignment.items(), key=lambda i: i[1].rank)
            if (holder := holders.get(slot)) is not None
            and holder.id == current.members[slot]
            and not state.hosts.slot_blacklisted(slot.host, slot.index, now)]


def leaving_holders(state: JobState, now: float) -> list[SlotId]:
    """Workers not in the current round, waiting to leave, that hold the state."""
    return [w.slot for w in state.workers.values()
            if w.alive and w.status is WorkerStatus.RUNNING and w.synced_round > 0
            and not state.is_member(w.id)
            and not state.hosts.slot_blacklisted(w.slot.host, w.slot.index, now)]


def state_lost(state: JobState, now: float) -> bool:
    """Training state was committed, and no live worker holds it any more."""
    if not state.state_committed:
        return False
    holders = state.holders()
    return not any(holders[slot].synced_round > 0 for slot in survivors(state, now, holders)) \
        and not leaving_holders(state, now)
