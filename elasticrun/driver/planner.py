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


class RoundPlanner:
    def __init__(self, registry: HostRegistry, rendezvous: Rendezvous,
                 max_np: int | None) -> None:
        self._registry = registry
        self._rendezvous = rendezvous
        self._max_np = max_np
        self.pool: WorkerPool | None = None  # set once the driver has started
        self.state_committed = False  # some worker has reported holding training state

    def desired(self, current: Assignment) -> Assignment:
        """The round the usable hosts give: hosts in their old order, survivors first."""
        usable = self._registry.usable(time.monotonic())
        ordered = order_hosts(hosts_in_rank_order(current), usable)
        return assign_keeping_state([(host, usable[host]) for host in ordered],
                                    self._max_np, self.survivors())

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

    def worker_synced(self, worker_id: str, round_number: int) -> None:
        worker = self.pool.get(worker_id) if self.pool else None
        if worker is not None and worker.alive:
            worker.synced_round = max(worker.synced_round, round_number)
            self.state_committed = True

    def state_lost(self) -> bool:
        """Training state was committed, and no surviving worker holds it any more."""
        if not self.state_committed or self.pool is None:
            return False
        pool = self.pool
        return not any((worker := pool.holder(slot)) is not None and worker.synced_round > 0
                       for slot in self.survivors())
