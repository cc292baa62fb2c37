"""The next round's membership, from the hosts that can be used and the workers still alive.

Policy lives in assignment.py (pure); this reads the live state it needs: which members of
the current round survive, and which of them hold the committed training state.
"""

from __future__ import annotations

import time

from elasticrun.driver.assignment import (
    Assignment,
    SlotId,
    assign_keeping_state,
    hosts_in_rank_order,
    order_hosts,
)
from elasticrun.driver.hosts import HostRegistry
from elasticrun.driver.pool import WorkerPool
from elasticrun.driver.rendezvous import Rendezvous
from elasticrun.driver.workers import WorkerState


class RoundPlanner:
    def __init__(self, registry: HostRegistry, rendezvous: Rendezvous,
                 max_np: int | None) -> None:
        self._registry = registry
        self._rendezvous = rendezvous
        self._max_np = max_np
        self.pool: WorkerPool | None = None  # set once the driver has started
        self.state_committed = False  # some worker has reported holding training state

    def desired(self, current: Assignment) -> Assignment:
        """The round the usable hosts give: hosts in their old order, survivors first. If no
        member holds the committed state but a leaving worker still does, it is kept."""
        usable = self._registry.usable(time.monotonic())
        ordered = order_hosts(hosts_in_rank_order(current), usable)
        survivors = self.survivors()
        keepers = survivors
        if self.state_committed:  # once there is state to keep, only its holders can
            keepers = [slot for slot in survivors if self._holds_state(slot)] \
                or self._leaving_holders() or survivors
        return assign_keeping_state([(host, usable[host]) for host in ordered],
                                    self._max_np, survivors, keepers)

    def survivors(self) -> list[SlotId]:
        """Slots of the current round whose workers are alive, in rank order."""
        current = self._rendezvous.current_round
        if current is None or self.pool is None:
            return []
        now = time.monotonic()
        return [slot for slot, _ in sorted(current.assignment.items(), key=lambda i: i[1].rank)
                if (holder := self.pool.holder(slot)) is not None
                and holder.id == current.members[slot]
                and not self._registry.is_blacklisted(slot.host, now)]

    def worker_synced(self, worker_id: str, round_number: int) -> bool:
        """Records a sync report; True when it settles the current round (every member
        holds the state now)."""
        worker = self.pool.get(worker_id) if self.pool else None
        if worker is None or not worker.alive:
            return False
        worker.synced_round = max(worker.synced_round, round_number)
        self.state_committed = True
        current = self._rendezvous.current_round
        if current is None or current.number != round_number or current.settled \
                or self.pool is None:
            return False
        if all((w := self.pool.get(wid)) is not None and w.synced_round >= round_number
               for wid in current.members.values()):
            self._rendezvous.mark_settled(round_number)
            return True
        return False

    def state_lost(self) -> bool:
        """Training state was committed, and no live worker holds it any more."""
        if not self.state_committed or self.pool is None:
            return False
        return not any(map(self._holds_state, self.survivors())) and not self._leaving_holders()

    def _holds_state(self, slot: SlotId) -> bool:
        worker = self.pool.holder(slot) if self.pool else None
        return worker is not None and worker.synced_round > 0

    def _leaving_holders(self) -> list[SlotId]:
        """Workers not in the current round, waiting to leave, that hold the state."""
        current = self._rendezvous.current_round
        members = set(current.members.values()) if current else set()
        now = time.monotonic()
        return [w.slot for w in (self.pool.workers.values() if self.pool else ())
                if w.alive and w.state is WorkerState.RUNNING and w.synced_round > 0
                and w.id not in members and not self._registry.is_blacklisted(w.slot.host, now)]
