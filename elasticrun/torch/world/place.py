"""This worker's place in the current round: Horovod's rank(), size() and friends."""

from __future__ import annotations

from elasticrun.torch.world import runtime


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
