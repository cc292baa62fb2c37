"""Horovod's process sets: collectives among a subset of the ranks, in jobs that are not elastic.

A process set is a torch.distributed subgroup of the round's Gloo group, which every rank
builds together (so `init(process_sets=...)`, `add_process_set` and `remove_process_set` are
collective, as Horovod's are). Ranks are global ranks, sorted (a permutation is the same
set), and so is a broadcast's root, as in Horovod; `ProcessSet.rank()` is this rank's place
in the set. Sets are numbered from 1 in the order they are added; the global set is 0. CUDA
tensors of a process set go through host memory on its Gloo group.

Sets live as long as the round they were made in: `shutdown()` ends them (init() makes
them again), and so would a reset. An elastic job's ranks change at every reset, so there a
fixed subset has no meaning: any set but the global one raises NotSupportedError.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from elasticrun import protocol
from elasticrun.job.errors import NotSupportedError
from elasticrun.torch.collectives.negotiation import negotiate
from elasticrun.torch.collectives.requests import Kind, Request
from elasticrun.torch.world import runtime
from elasticrun.torch.world.groups import new_group
from elasticrun.torch.world.place import Scope

_WHY_ELASTIC = ("an elastic job's ranks change at every reset, so a fixed subset of them has "
                "no meaning (process sets work in jobs with a fixed -np)")


class ProcessSet:
    """`ProcessSet(ranks)`: usable once given to init(process_sets=...) or add_process_set()."""

    def __init__(self, ranks_or_comm: Sequence[int] | Any = None) -> None:
        if ranks_or_comm is not None and not isinstance(ranks_or_comm, (Sequence, range)) \
                and not hasattr(ranks_or_comm, "__iter__"):
            raise NotSupportedError("ProcessSet from an MPI communicator: elasticrun has no MPI")
        ranks = None if ranks_or_comm is None else sorted(ranks_or_comm)
        if ranks is not None and any(not isinstance(r, int) for r in ranks):
            raise ValueError("ProcessSet should be initialized with a list of process ranks")
        self.ranks: list[int] | None = ranks
        self.process_set_id: int | None = 0 if ranks is None else None
        self._group: dist.ProcessGroup | None = None
        self._round = -1

    def size(self) -> int | None:
        """The number of ranks in the set (None while the set is not initialised)."""
        if self.process_set_id is None:
            return None
        return runtime.current().slot.size if self.process_set_id == 0 else len(self._members)

    def rank(self) -> int | None:
        """This rank's place in the set (None: not in it, or the set is not initialised)."""
        if self.process_set_id is None:
            return None
        rank = runtime.current().slot.rank
        if self.process_set_id == 0:
            return rank
        return self._members.index(rank) if rank in self._members else None

    def included(self) -> bool | None:
        """Whether this rank is in the set."""
        if self.process_set_id == 0:
            return True
        return None if self.ranks is None else runtime.current().slot.rank in self.ranks

    @property
    def _members(self) -> list[int]:
        assert self.ranks is not None
        return self.ranks

    def __repr__(self) -> str:
        if self.process_set_id == 0:
            return "ProcessSet(global)"
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet()
_registered: dict[int, ProcessSet] = {}  # id -> set, of the current round


def _elastic() -> bool:
    return os.environ.get(protocol.ENV_ELASTIC, "0") == "1"


def _is_global(process_set: ProcessSet | None) -> bool:
    return process_set is None or process_set is global_process_set or (
        isinstance(process_set, ProcessSet) and process_set.process_set_id == 0)


def scope(process_set: ProcessSet | None, what: str) -> Scope:
    """The scope of a collective with `process_set=` (None: the global set); raises when the
    set cannot be used here."""
    slot = runtime.current().slot
    if _is_global(process_set):
        return Scope(None, slot.rank, slot.size)
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"{what}: process_set={process_set!r} is not a ProcessSet")
    if _elastic():
        raise NotSupportedError(f"{what} with process_set={process_set!r}: {_WHY_ELASTIC}")
    if process_set.process_set_id is None or \
            _registered.get(process_set.process_set_id) is not process_set:
        raise ValueError(f"{what}: {process_set!r} is not initialised: give it to "
                         f"init(process_sets=...) or add_process_set()")
    if process_set._round != runtime.current().round:
        raise NotSupportedError(f"{what}: {process_set!r} ended with its round (a reset or "
                                f"shutdown() ends process sets; add them again)")
    place = process_set.rank()
    if place is None:
        raise ValueError(f"{what} with {process_set!r}: rank {slot.rank} is not in it")
    return Scope(process_set._group, place, len(process_set._members))


def check(process_set: ProcessSet | None, what: str) -> None:
    """Raises when `process_set` cannot be used by a collective here (the global set can
    always be, before init() too: a DistributedOptimizer may be built before it)."""
    if not _is_global(process_set):
        scope(process_set, what)


def _build(process_set: ProcessSet) -> None:
    """The set's subgroup, built by every rank of the round (torch needs all of them)."""
    live = runtime.current()
    timeout = datetime.timedelta(seconds=live.collective_timeout)
    process_set._group = new_group(process_set._members, timeout)
    process_set._round = live.round
    process_set.process_set_id = max(_registered, default=0) + 1
    _registered[process_set.process_set_id] = process_set


def _current() -> dict[int, ProcessSet]:
    """The sets of this round (those of an earlier round are forgotten)."""
    number = runtime.current().round
    for key in [k for k, s in _registered.items() if s._round != number]:
        _registered[key].process_set_id = None
        del _registered[key]
    return _registered


def _valid(ranks: list[int], what: str) -> None:
    size = runtime.current().slot.size
    if not ranks or len(set(ranks)) != len(ranks) or ranks[0] < 0 or ranks[-1] >= size:
        raise ValueError(f"{what}: {ranks} is not a set of ranks in 0..{size - 1}")


def init_process_sets(process_sets: Sequence[ProcessSet]) -> None:
    """`init(process_sets=...)`: the sets, in order (a set given twice, or equal to the
    global one, raises ValueError on every rank)."""
    sets = [s if isinstance(s, ProcessSet) else ProcessSet(s) for s in process_sets]
    if _elastic() and sets:
        raise NotSupportedError(f"init(process_sets=...): {_WHY_ELASTIC}")
    _current()
    seen = [tuple(s._members) for s in sets if s.ranks is not None]
    if len(set(seen)) != len(seen):
        raise ValueError(f"init(process_sets=...): a process set is given twice: {seen}")
    for ranks in seen:
        _valid(list(ranks), "init(process_sets=...)")
    for process_set in sets:
        if process_set.ranks is not None:
            _build(process_set)


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Adds a set after init() (every rank calls it, with the same ranks) and returns it."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None:
        raise ValueError("add_process_set: the global process set exists already")
    if _elastic():
        raise NotSupportedError(f"add_process_set({process_set.ranks}): {_WHY_ELASTIC}")
    _valid(process_set._members, "add_process_set")
    problem = None
    if any(s.ranks == process_set.ranks for s in _current().values()):
        problem = ValueError(f"Attempted to add a duplicate process set: {process_set!r}")
    negotiate(Request(Kind.OBJECT, name=f"add_process_set({process_set.ranks})",
                      error=str(problem) if problem else ""), problem)
    _build(process_set)
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Removes a set added before (every rank calls it); False for the global set and for a
    set that is not initialised."""
    key = process_set.process_set_id
    if not key or _current().get(key) is not process_set:
        return False
    negotiate(Request(Kind.OBJECT, name=f"remove_process_set({key})"))
    del _registered[key]
    group, process_set._group = process_set._group, None
    process_set.process_set_id = None
    if group is not None:
        dist.destroy_process_group(group)
    return True
