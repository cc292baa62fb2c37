"""A bucket summed through shared memory, when every rank of the round shares one machine.

Gloo moves a CPU bucket through loopback TCP: a 4 MiB bucket between two ranks takes ~4 ms
on a 2-core machine, where reading the peer's memory takes ~0.5 ms. So when every rank of a
round runs on one machine (the same boot, the same PID namespace), each rank's bucket lives
in a memfd that every peer maps: gradients accumulate straight into it (they are views of
the bucket), and a sum is three phases, each closed by every rank bumping its own counter:
1. the bucket is ready;
2. each rank has summed its own shard of every bucket into its bucket;
3. each rank has copied the other shards from their owners (so none is changed while it
   is still being read).
Every shard is summed by one rank only, so every rank ends with the same bits. A round of
several machines, a process set, GPUs or a rank that has joined use Gloo as before; so does
a machine other than x86-64, where stores may be seen out of order (this relies on x86's
ordered stores: a counter is seen after the data written before it).

The memfds are named nowhere: a peer opens one through /proc/<pid>/fd, and the memory goes
when the last process that maps it does (no file left behind, whatever kills the job).
Waiting is polling (a short spin, then sleeps of ~0.1 ms), bounded and abortable like a Gloo
work's: the round's session waits for it (works.py), so a lost or hung peer releases it.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import platform
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from elasticrun.torch.world import plane, runtime

ENV_DISABLE = "ELASTICRUN_SHARED_MEMORY"  # "0": every bucket goes through Gloo
COUNTER_BYTES = 64  # the owner's phase counter, on a cache line of its own
SPIN_S = 50e-6  # spin this long before sleeping between looks at the peers' counters
POLL_S = 50e-6  # then sleep this long (the kernel's timer slack adds ~50 us)
PHASES = 3


def eligible_machine() -> bool:
    """Linux (memfd, /proc) on x86-64 (ordered stores)."""
    return hasattr(os, "memfd_create") and platform.machine() == "x86_64"


def wanted() -> bool:
    """This process may share its buckets (a local answer: connect() makes it everyone's)."""
    return os.environ.get(ENV_DISABLE, "1") != "0" and eligible_machine()


def placed_for_it(params: Sequence[torch.Tensor], scoped: bool) -> bool:
    """Whether this round may sum buckets of `params` here: every rank on one host, CPU
    tensors, the round's own group (`scoped`: a process set's). The same answer on every
    rank, as it depends on the round's placement only: every rank then connects()."""
    if scoped or params[0].is_cuda:
        return False
    slot = runtime.current().slot
    return slot.size > 1 and slot.local_size == slot.size


class Sharing:
    """A reduction's buckets in one round: made in shared memory as they are allocated (if
    the round is `placed` for it and this process wants it), connected at the round's first
    step that no rank has joined (every rank then connects, at the same point)."""

    def __init__(self, placed: bool) -> None:
        self._pending = placed
        self._buffers: list[SharedBuffer] = []
        self.shared: SharedBuckets | None = None

    def maker(self) -> Callable[[int, torch.dtype], torch.Tensor] | None:
        """What makes a bucket's flat tensor (None: ordinary memory)."""
        return self._make if self._pending and wanted() else None

    def _make(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        try:
            buffer = SharedBuffer(numel, dtype)
        except OSError:  # (no memfd here): this bucket in ordinary memory, the round on Gloo
            return torch.zeros(numel, dtype=dtype)
        self._buffers.append(buffer)
        return buffer.data

    def connect_once(self, count: int) -> None:
        if self._pending:
            self._pending = False
            buffers, self._buffers = self._buffers, []
            self.shared = connect(buffers, count)


def _layout(mapped: mmap.mmap, numel: int, dtype: torch.dtype
            ) -> tuple[memoryview, torch.Tensor]:
    """A bucket's mapping: its owner's counter, then its data."""
    return (memoryview(mapped)[:8].cast("q"),
            torch.frombuffer(mapped, dtype=dtype, count=numel, offset=COUNTER_BYTES))


class SharedBuffer:
    """One rank's bucket in a memfd: its counter, then its data."""

    def __init__(self, numel: int, dtype: torch.dtype) -> None:
        self.numel, self.dtype = numel, dtype
        size = COUNTER_BYTES + numel * dtype.itemsize
        self.fd = os.memfd_create("elasticrun-bucket", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size)
        self.counter, self.data = _layout(self.map, numel, dtype)

    def close_fd(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _Peer:
    """A peer's bucket, mapped from its memfd."""

    def __init__(self, pid: int, fd: int, numel: int, dtype: torch.dtype) -> None:
        size = COUNTER_BYTES + numel * dtype.itemsize
        opened = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
        try:
            if os.fstat(opened).st_size < size:  # not the bucket agreed on
                raise OSError(f"/proc/{pid}/fd/{fd} is not a bucket of {numel} elements")
            self.map = mmap.mmap(opened, size)
        finally:
            os.close(opened)
        self.counter, self.data = _layout(self.map, numel, dtype)


def _machine() -> int:
    """This machine and PID namespace, as one number (equal: /proc/<pid> names the peer);
    -1 where /proc does not say."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            boot = file.read().strip()
        identity = f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}".encode()
    except OSError:
        return -1
    return int.from_bytes(hashlib.blake2b(identity, digest_size=7).digest(), "big")


def connect(buffers: Sequence[SharedBuffer], count: int) -> SharedBuckets | None:
    """Maps every peer's buffers (a collective of every rank of the round, at the same
    point; `count`: the buckets, `buffers` this rank's, none if it does not want to share).
    None on every rank alike when any rank cannot: the buckets then go through Gloo, this
    round."""
    slot = runtime.current().slot
    sharing = len(buffers) == count  # else: -1 everywhere, and every rank gives up
    fds = [b.fd for b in buffers] if sharing else [-1] * count
    mine = torch.tensor([_machine() if sharing else -1, os.getpid(), *fds], dtype=torch.int64)
    parts = [torch.empty_like(mine) for _ in range(slot.size)]
    plane.all_gather(parts, mine)
    peers: list[list[_Peer | None]] = [[] for _ in buffers]
    opened = int(all(int(p[0]) == int(mine[0]) >= 0 and min(p[2:].tolist(), default=-1) >= 0
                     for p in parts))
    if opened:
        try:
            for rank, part in enumerate(parts):
                pid, peer_fds = int(part[1]), part[2:].tolist()
                for index, buffer in enumerate(buffers):
                    peers[index].append(None if rank == slot.rank else
                                        _Peer(pid, peer_fds[index], buffer.numel,
                                              buffer.dtype))
        except OSError:
            opened = 0
    agreed = torch.tensor([opened], dtype=torch.int64)
    plane.all_reduce(agreed, op=dist.ReduceOp.MIN)
    for buffer in buffers:  # every peer has mapped it (or given up): the fd has served
        buffer.close_fd()
    if not int(agreed):
        return None
    return SharedBuckets(list(buffers), peers, slot.rank)


class SharedBuckets:
    """The round's buckets, this rank's and every peer's."""

    def __init__(self, buffers: list[SharedBuffer], peers: list[list[_Peer | None]],
                 rank: int) -> None:
        self.buffers, self.peers, self.rank = buffers, peers, rank
        self.sums = [0] * len(buffers)

    def start(self, index: int) -> SharedSum:
        """Bucket `index` is ready: its sum, to wait for (through the round's session)."""
        self.sums[index] += 1
        return SharedSum(self.buffers[index], self.peers[index], self.rank, self.sums[index])


class SharedSum:
    """One sum of one bucket, a work in Gloo's manner: `is_completed()` moves it on as far
    as the peers allow; `wait(timeout)` moves it to the end, raising RuntimeError when
    `timeout` runs out first."""

    def __init__(self, buffer: SharedBuffer, peers: list[_Peer | None], rank: int,
                 number: int) -> None:
        self._buffer, self._peers, self._rank = buffer, peers, rank
        self._base = (number - 1) * PHASES  # the counter before this sum
        size, numel = len(peers), buffer.numel
        self._bounds = [(r * numel // size, (r + 1) * numel // size) for r in range(size)]
        self._phase = 0
        self._signal()  # phase 1: this rank's bucket is ready

    def _signal(self) -> None:
        self._phase += 1
        self._buffer.counter[0] = self._base + self._phase

    def _peers_reached(self) -> bool:
        target = self._base + self._phase
        return all(peer is None or peer.counter[0] >= target for peer in self._peers)

    def is_completed(self) -> bool:
        while True:
            if not self._peers_reached():
                return False
            if self._phase == PHASES:
                return True
            if self._phase == 1:  # sum this rank's shard of every bucket into this one
                low, high = self._bounds[self._rank]
                shard = self._buffer.data[low:high]
                for peer in self._peers:
                    if peer is not None:
                        shard.add_(peer.data[low:high])
            else:  # copy the other shards from the ranks that summed them
                for rank, peer in enumerate(self._peers):
                    if peer is not None:
                        low, high = self._bounds[rank]
                        self._buffer.data[low:high].copy_(peer.data[low:high])
            self._signal()

    def wait(self, timeout: timedelta | None = None) -> bool:
        started = time.monotonic()
        deadline = started + timeout.total_seconds() if timeout is not None else float("inf")
        while not self.is_completed():
            now = time.monotonic()
            if now >= deadline:
                raise RuntimeError("shared-memory sum: timed out waiting for the peers")
            if now - started < SPIN_S:
                os.sched_yield()
            else:
                time.sleep(POLL_S)
        return True


class Waiting:
    """A SharedSum waited for through the round's session: released when the round is
    aborted, bounded by the collective timeout, a long wait reported as a Gloo work's is."""

    def __init__(self, work: SharedSum) -> None:
        self._work = work
        self._session = runtime.current().session

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def wait(self, timeout: timedelta | None = None) -> bool:
        if self._session is None:
            return self._work.wait()
        self._session.wait(self._work)
        return True
