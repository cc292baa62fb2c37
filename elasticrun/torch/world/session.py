"""One round of the job as this worker sees it: its place, its store, its process group.

A `RoundSession` is made for every round this worker joins, in the spirit of torchft's
reconfigurable process group (configure, abort): `build()` connects the round's Gloo group
through the driver's store, under the round's key prefix, and on GPUs (backend "nccl") an
NCCL group for CUDA tensors; `abort()` (from any thread: the notice watcher calls it when
the driver says the round broke) cuts the Gloo group's connections and aborts the NCCL
communicators, so every collective blocked on them, here and on the peers, fails at once
and the process lives on; `leave()` aborts and tears the groups down. A session is used for
one round only.

Every Gloo and NCCL workaround lives here, in groups.py or in works.py: Gloo offers no
abort (so the session notes the sockets its group opened and shuts them down, and releases
its own waits on the round's works, since Gloo can lose a send whose peer died as it was
written), torch names a group's store keys from a process-wide counter that a failed build
must not advance, a group's native side waits for its works when torn down (so it goes
once they have ended, never during interpreter teardown), and NCCL communicators are
non-blocking (NCCL's condition for a safe abort) and aborted, never merely destroyed, when
a round ends.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from elasticrun import protocol
from elasticrun.protocol import SlotInfo
from elasticrun.torch.world.boundary import collective
from elasticrun.torch.world.devices import DataPlane
from elasticrun.torch.world.groups import (
    abort_nccl,
    agree_on_nccl,
    default_group,
    destroy_process_group,
    init_nccl_group,
    init_process_group,
)
from elasticrun.torch.world.replicas import ReplicaGroups, ReplicaLayout
from elasticrun.torch.world.works import InFlight, Work, drop_when_done, wait_abortably
from elasticrun.worker.elastic import WorkersFailedError
from elasticrun.worker.liveness import StallWatch
from elasticrun.worker.sockets import new_tcp_sockets, open_socket_fds, sever
from elasticrun.worker.store import DriverStore

log = logging.getLogger("elasticrun.worker")

# How long past the collective timeout a wait is bounded, should Gloo never end the work.
ABANDON_SLACK_S = 5.0
# Builds the default process group: (slot, store, collective timeout in seconds).
Connect = Callable[[SlotInfo, dist.Store, float], None]


class RoundSession:
    """This worker's membership in one round: build it, abort it, leave it."""

    def __init__(
        self,
        number: int,
        slot: SlotInfo,
        store: dist.Store,
        *,
        notice_seq: int = 0,
        collective_timeout: float = 60.0,
        driver_peer: tuple[str, int] = ("", 0),
        key_prefix: str = "",
        backend: str = "gloo",
        device: torch.device | None = None,
        agree: bool = False,
        stall_watch: StallWatch | None = None,
        shard_size: int = 1,
    ) -> None:
        self.number = number
        self.stall_watch = stall_watch  # reports waits far longer than usual (hang detection)
        self.slot = slot
        self.notice_seq = notice_seq  # the latest host-change notice this round reflects
        self.store = store  # kept alive as long as the group: torch calls back into it
        self.collective_timeout = collective_timeout
        self._driver_peer = driver_peer  # connections to the driver are never cut
        self._key_prefix = key_prefix
        self.backend = backend  # for CUDA tensors: "nccl" or "gloo" (through host memory)
        self.device = device  # the GPU this worker is pinned to, if any
        self._agree = agree  # backend "auto": NCCL only if every rank can use it
        self.device_group: dist.ProcessGroup | None = None  # NCCL, for CUDA tensors
        self.shard_size = shard_size  # --shard-size: replica groups are built when above 1
        self.replicas: ReplicaGroups | None = None
        self._lock = threading.Lock()
        self._sockets: dict[int, str] = {}  # fd -> inode of the group's connections
        self._aborted = False
        self._drained = False  # a clean leave: the device finished the round's work first
        self._in_flight = InFlight()  # Gloo works issued in this round, maybe running
        self._built = False

    @classmethod
    def for_reply(cls, reply: protocol.JoinReply, store: dist.Store, collective_timeout: float,
                  driver_peer: tuple[str, int], plane: DataPlane,
                  stall_watch: StallWatch | None = None, shard_size: int = 1) -> RoundSession:
        """The session of the round the driver just placed this worker in."""
        assert reply.slot is not None
        return cls(reply.round, reply.slot, store, notice_seq=reply.notice_seq,
                   collective_timeout=collective_timeout, driver_peer=driver_peer,
                   key_prefix=protocol.round_prefix(reply.round), backend=plane.backend,
                   device=plane.device, agree=plane.agree, stall_watch=stall_watch,
                   shard_size=shard_size)

    @property
    def built(self) -> bool:
        return self._built

    @property
    def aborted(self) -> bool:
        return self._aborted

    def build(self, connect: Connect = init_process_group) -> None:
        """Builds the round's process group. Raises WorkersFailedError when the peers do not
        all come (one died, hung, or the round broke meanwhile)."""
        if self._built:
            raise RuntimeError(f"round {self.number}'s group is already built")
        if self._aborted:
            raise WorkersFailedError(f"round {self.number} broke before its group was built")
        store = dist.PrefixStore(self._key_prefix, self.store) if self._key_prefix \
            else self.store
        before = open_socket_fds()
        try:
            with collective(f"building round {self.number}'s group"):
                with self._full_mesh():
                    connect(self.slot, store, self.collective_timeout)
                self._hold_sockets(before)
                self._build_device_group()
                self._build_replica_groups()
            self._built = True
        finally:  # on failure too: a half-built group's connections must be cut
            with self._lock:
                self._sockets = new_tcp_sockets(before, self._driver_peer)
                if self._aborted:  # the round broke while the group was being built
                    sever(self._sockets)
                    self._sockets = {}

    def _hold_sockets(self, before: dict[int, str]) -> None:
        """The connected group's sockets, for abort() to cut while the build goes on (its
        NCCL vote waits on the peers, one of which may be lost meanwhile)."""
        with self._lock:
            self._sockets = new_tcp_sockets(before, self._driver_peer)
            if self._aborted:
                raise WorkersFailedError(f"round {self.number} broke while its group was "
                                         f"being built")

    def _full_mesh(self) -> contextlib.AbstractContextManager[None]:
        """The driver's store fetches every rank's Gloo address in one request (not NCCL's
        keys: only the Gloo connect runs inside)."""
        if isinstance(self.store, DriverStore):
            return self.store.full_mesh(self.slot.size)
        return contextlib.nullcontext()

    def _build_device_group(self) -> None:
        if self._agree:  # every rank votes, those without NCCL too
            chosen = agree_on_nccl(self.backend == "nccl", self._wait_in_build)
            if self.backend == "nccl" and not chosen:
                log.warning("round %d: not every rank can use NCCL; CUDA tensors go through "
                            "host memory on Gloo this round", self.number)
            self.backend = "nccl" if chosen else "gloo"
        if self.backend != "nccl":
            return
        group = init_nccl_group(self.device, self.collective_timeout)
        with self._lock:
            self.device_group = group
            if self._aborted:  # the round broke while the communicator was connecting
                abort_nccl(group)

    def _build_replica_groups(self) -> None:
        if self.shard_size == 1:
            return
        layout = ReplicaLayout(self.slot.rank, self.slot.size, self.shard_size)
        replicas = ReplicaGroups.build(layout, self.collective_timeout,
                                       nccl=self.backend == "nccl")
        with self._lock:
            self.replicas = replicas
            if self._aborted:
                replicas.abort(drained=False)

    def _wait_in_build(self, work: dist.Work) -> None:
        """The build's own collective: abortable as wait() (but no stall is reported: a
        round being formed has its laggards looked at by the driver anyway)."""
        self.track(work)
        self._wait_unwatched(work)

    def track(self, work: dist.Work) -> None:
        """Notes a Gloo work issued in this round: its groups outlive it (see works.py)."""
        self._in_flight.add(work)

    def wait(self, work: Work) -> None:
        """`work.wait()` for a Gloo work of this round (or one that waits as one does: a
        shared-memory sum), released by `abort()` too: then, if the work has not
        completed, it is abandoned with WorkersFailedError. (Cutting the
        sockets is not always enough: Gloo loses a send that hit a peer's death at the
        moment it was written, and its wait lasts the whole collective timeout.) A wait far
        longer than usual is reported to the driver, which looks for a hung member."""
        bound = self.collective_timeout + ABANDON_SLACK_S
        watch = self.stall_watch
        if watch is None:
            self._wait_unwatched(work)
            return
        clock = watch.clock
        after, designated = watch.stall_after(self.slot.rank, self.slot.size)
        entered = clock.enter()
        completed = False
        try:
            wait_abortably(work, lambda: self._aborted, bound, self.number,
                           (after, lambda waited: watch.report(self.number, waited,
                                                               designated, entered)))
            completed = True
        finally:
            clock.leave(entered, completed)

    def _wait_unwatched(self, work: dist.Work) -> None:
        wait_abortably(work, lambda: self._aborted, self.collective_timeout + ABANDON_SLACK_S,
                       self.number)

    def abort(self) -> int:
        """Cuts the round's connections, releases every `wait()` and aborts the NCCL
        communicators: collectives blocked on them, here and on every peer, fail at once.
        Safe from any thread; returns how many Gloo connections were cut."""
        with self._lock:
            self._aborted = True
            count = sever(self._sockets)
            self._sockets = {}
            group = self.device_group
            replicas = self.replicas
        if group is not None:
            abort_nccl(group, drained=self._drained)
        if replicas is not None:
            replicas.abort(drained=self._drained)
        return count

    def leave(self, *, last: bool = False) -> None:
        """Cuts the round's connections (peers blocked on this worker fail at once), then
        destroys its group. Its native side goes once the round's works have ended, on a
        teardown thread (works.py); `last` with nothing in flight: now, since nothing
        follows and torch 2.13's Gloo threads can abort the process when a group is only
        collected during interpreter teardown."""
        if self.device_group is not None and not self._aborted:
            # Leaving whole (a host change, shutdown): every rank leaves at the same point,
            # so the GPU's queued reductions complete rather than being cut by the abort.
            try:
                torch.cuda.synchronize(self.device)
                self._drained = not self._aborted
            except RuntimeError as exc:  # a CUDA error: the abort goes ahead, unsettled
                log.warning("round %d: the GPU did not finish its work: %s", self.number, exc)
        self.abort()
        gc.collect(1)  # young cycles may still hold the round's works
        groups = [group for group in (default_group(), self.device_group) if group is not None]
        if self.replicas is not None:
            groups += self.replicas.groups()
        destroy_process_group()
        self.device_group = None
        self.replicas = None
        in_flight = self._in_flight.pending()
        if last and not in_flight:
            groups.clear()
            gc.collect()
        else:
            deadline = time.monotonic() + self.collective_timeout + ABANDON_SLACK_S
            drop_when_done(groups, in_flight, deadline)

    def publish_env(self) -> None:
        """Keeps the environment true for code that reads it after a reset."""
        slot = self.slot
        values = {
            protocol.ENV_RANK: slot.rank, protocol.ENV_SIZE: slot.size,
            protocol.ENV_LOCAL_RANK: slot.local_rank, protocol.ENV_LOCAL_SIZE: slot.local_size,
            protocol.ENV_CROSS_RANK: slot.cross_rank, protocol.ENV_CROSS_SIZE: slot.cross_size,
            "RANK": slot.rank, "WORLD_SIZE": slot.size, "LOCAL_RANK": slot.local_rank,
            "LOCAL_WORLD_SIZE": slot.local_size,
        }
        os.environ.update({name: str(value) for name, value in values.items()})
