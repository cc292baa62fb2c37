"""Growing while training goes on: the next round's new workers start now, as standbys.

When the hosts would give a different round, the workers it needs are started at once
while the current round keeps training. Only when every one of them has checked in is the
current round told (a notice to its workers) to make room at its next commit, so training
pauses for the rendezvous and the sync, not for the newcomers' interpreter and torch start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from elasticrun.driver.assignment import Assignment, SlotId
from elasticrun.driver.placement import Placement
from elasticrun.driver.pool import WorkerPool
from elasticrun.driver.rendezvous import Rendezvous
from elasticrun.driver.workers import new_worker_id

log = logging.getLogger("elasticrun.driver")

# (slot, worker id, assignment, master endpoint, standby) -> started (or failed: recorded)
SpawnFn = Callable[[SlotId, str, Assignment, tuple[str, int], bool], Awaitable[None]]


class Standbys:
    def __init__(self, pool: WorkerPool, rendezvous: Rendezvous, placement: Placement,
                 min_np: int, spawn: SpawnFn) -> None:
        self._pool = pool
        self._rendezvous = rendezvous
        self._placement = placement
        self._min_np = min_np
        self._spawn = spawn
        self._pending: Assignment | None = None  # the next round, while its standbys start
        self._notified: Assignment | None = None
        self._ids: set[str] = set()
        self._ready: set[str] = set()
        self._warned_small: Assignment | None = None

    def hosts(self) -> frozenset[str]:
        return frozenset(w.slot.host for wid in self._ids if (w := self._pool.get(wid)))

    def round_opened(self) -> None:
        """The standbys are members now, or have no place (they are told to leave)."""
        self._pending = self._notified = None
        self._ids.clear()
        self._ready.clear()

    def forget(self, worker_id: str) -> None:
        self._ids.discard(worker_id)
        self._ready.discard(worker_id)

    def is_waiting(self, worker_id: str) -> bool:
        """A standby that has not checked in yet."""
        return worker_id in self._ids and worker_id not in self._ready

    def checked_in(self, worker_id: str) -> None:
        if worker_id in self._ids:
            self._ready.add(worker_id)
            self._notify_if_ready()

    async def prepare(self, current: Assignment, desired: Assignment) -> None:
        """Moves towards `desired`: stops unwanted standbys, starts missing ones, and
        notifies the current round once all are ready."""
        for worker_id in list(self._ids):  # standbys the hosts no longer want
            worker = self._pool.get(worker_id)
            if worker is not None and worker.slot not in desired:
                self.forget(worker_id)
                self._pool.stop_host_slot(worker.slot)
        if desired == current or len(desired) < self._min_np:
            if len(desired) < self._min_np and desired != self._warned_small:
                self._warned_small = desired
                log.warning("hosts changed, but %d slot(s) are fewer than --min-np %d; "
                            "training continues on the current hosts", len(desired),
                            self._min_np)
            self._pending = None
            return
        self._pending = desired
        missing = [slot for slot in desired if self._pool.holder(slot) is None]
        if missing:
            log.info("hosts changed: starting %d worker(s) for the next round while "
                     "training continues", len(missing))
            master = self._placement.master_endpoint(desired)
            ids = {slot: new_worker_id(slot) for slot in missing}
            self._ids.update(ids.values())
            await asyncio.gather(*(self._spawn(slot, ids[slot], desired, master, True)
                                   for slot in missing))
        self._notify_if_ready()

    def _notify_if_ready(self) -> None:
        desired = self._pending
        if desired is None or desired == self._notified or self._ready < self._ids:
            return
        self._notified = desired
        seq = self._rendezvous.post_notice()
        log.info("hosts changed: next round will have world size %d; notified workers "
                 "(notice %d)", len(desired), seq)
