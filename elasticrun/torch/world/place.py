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
    return runtime.current().slot.rank


def size() -> int:
    return runtime.current().slot.size


def local_rank() -> int:
    return runtime.current().slot.local_rank


def local_size() -> int:
    return runtime.current().slot.local_size


def cross_rank() -> int:
    return runtime.current().slot.cross_rank


def cross_size() -> int:
    return runtime.current().slot.cross_size


def world() -> tuple[int, int]:
    """(this worker's rank, the round's size)."""
    slot = runtime.current().slot
    return slot.rank, slot.size
