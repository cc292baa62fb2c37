"""Horovod's process sets, as far as elasticrun has them: the global set only.

An elastic job's membership changes from round to round, so a fixed subset of ranks has no
meaning across a reset; collectives accept `process_set=global_process_set` (or None) and
refuse any other set with a NotSupportedError that says so."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from elasticrun.errors import NotSupportedError
from elasticrun.torch.world import runtime

_WHY = ("elasticrun supports only the global process set: ranks change at every reset of "
        "an elastic job, so a fixed subset of them has no meaning")


class ProcessSet:
    """`ProcessSet(ranks)`; only the global set (every rank) can be used."""

    def __init__(self, ranks_or_comm: Sequence[int] | Any = None) -> None:
        if ranks_or_comm is not None and not isinstance(ranks_or_comm, Sequence):
            raise NotSupportedError("ProcessSet from an MPI communicator: elasticrun has no MPI")
        self.ranks = sorted(ranks_or_comm) if ranks_or_comm is not None else None
        self.process_set_id: int | None = 0 if ranks_or_comm is None else None

    def size(self) -> int | None:
        return runtime.current().slot.size if self.process_set_id == 0 else None

    def rank(self) -> int | None:
        return runtime.current().slot.rank if self.process_set_id == 0 else None

    def included(self) -> bool | None:
        return True if self.process_set_id == 0 else None

    def __repr__(self) -> str:
        return "ProcessSet(global)" if self.process_set_id == 0 else f"ProcessSet({self.ranks})"


global_process_set = ProcessSet()


def check(process_set: ProcessSet | None, what: str) -> None:
    """Refuses anything but the global set (None means the global set)."""
    if process_set is None or process_set is global_process_set:
        return
    if isinstance(process_set, ProcessSet) and process_set.process_set_id == 0:
        return
    raise NotSupportedError(f"{what} with process_set={process_set!r}: {_WHY}")


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    ranks = process_set.ranks if isinstance(process_set, ProcessSet) else sorted(process_set)
    if ranks is not None and list(ranks) == list(range(runtime.current().slot.size)):
        return global_process_set
    raise NotSupportedError(f"add_process_set({ranks}): {_WHY}")


def remove_process_set(process_set: ProcessSet) -> bool:
    raise NotSupportedError(f"remove_process_set({process_set!r}): {_WHY}")
