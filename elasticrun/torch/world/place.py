"""This worker's place in the current round: Horovod's rank(), size() and friends, and the
scope a collective runs in (the round's group, or a process set's)."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from elasticrun.torch.world import runtime


@dataclass(frozen=True)
class Scope:
    """Where a collective runs: the round's group (`group` None) or a process set's."""

    group: dist.ProcessGroup | None
    rank: int  # this rank's place among them
    size: int


def rank() -> int:
    """This worker's rank in the current round, 0 to size() - 1. Ranks are given host by
    host, the oldest surviving host first, and may change at a reset."""
    return runtime.current().slot.rank


def size() -> int:
    """The number of workers in the current round."""
    return runtime.current().slot.size


def local_rank() -> int:
    """This worker's rank among the workers of its host, 0 to local_size() - 1."""
    return runtime.current().slot.local_rank


def local_size() -> int:
    """The number of workers of the current round on this worker's host."""
    return runtime.current().slot.local_size


def cross_rank() -> int:
    """This worker's rank among the workers of the current round that have its local rank
    (Horovod's cross rank: its host's place among the hosts that run such a worker)."""
    return runtime.current().slot.cross_rank


def cross_size() -> int:
    """The number of workers in the current round that have this worker's local rank
    (the number of hosts, when every host runs as many workers)."""
    return runtime.current().slot.cross_size


def world() -> tuple[int, int]:
    """(this worker's rank, the round's size)."""
    slot = runtime.current().slot
    return slot.rank, slot.size
