"""Named asynchronous collectives are matched across ranks by name, as Horovod's coordinator
matches them: ranks may submit them in different orders, and collectives of other names
complete meanwhile (collectives/deferral.py). Real Gloo ranks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

import elasticrun.torch as hvd
from tests.collectives.conftest import world_of

QUICK_S = 5.0  # far below the world's 15 s collective timeout


def _then_works() -> bool:
    return bool(hvd.allreduce(torch.ones(3), op=hvd.Sum).eq(hvd.size()).all())


ASYNC: dict[str, Callable[[str], int]] = {
    "allreduce": lambda name: hvd.allreduce_async(torch.ones(4), name=name),
    "allgather": lambda name: hvd.allgather_async(torch.ones(2, 3), name=name),
    "broadcast": lambda name: hvd.broadcast_async(torch.ones(4), root_rank=0, name=name),
    "alltoall": lambda name: hvd.alltoall_async(torch.ones(2 * hvd.size()), name=name),
    "reducescatter": lambda name: hvd.reducescatter_async(torch.ones(2 * hvd.size()),
                                                          name=name),
}


def _horovods_duplicate_name_test(kind: str) -> dict[str, Any]:
    """Horovod's test_horovod_<kind>_duplicate_name_error, rank by rank: rank 0 submits the
    name twice (the second raises at once) while rank 1 waits in a barrier; then rank 1."""
    started = time.monotonic()
    raised = []
    for turn in range(2):
        if hvd.rank() == turn:
            ASYNC[kind]("duplicate_name")
            try:
                ASYNC[kind]("duplicate_name")
                raised.append("nothing")
            except ValueError as exc:
                raised.append(type(exc).__name__)
        hvd.barrier()
    return {"raised": raised, "seconds": time.monotonic() - started, "then": _then_works()}


@pytest.mark.parametrize("kind", sorted(ASYNC))
def test_horovods_duplicate_name_test_passes(kind: str) -> None:
    for rank, result in enumerate(world_of(2).run(_horovods_duplicate_name_test, kind)):
        assert result["raised"] == ["ValueError"], (rank, result)
        assert result["then"] and result["seconds"] < QUICK_S, result


def _in_opposite_orders() -> dict[str, Any]:
    rank, size = hvd.rank(), hvd.size()
    values = {"a": torch.full((3,), 1.0 + rank), "b": torch.full((5,), 10.0 * (rank + 1))}
    order = ["a", "b"] if rank % 2 == 0 else ["b", "a"]
    handles = {name: hvd.allreduce_async(values[name], name=name, op=hvd.Sum) for name in order}
    hvd.barrier()  # another collective completes while they wait for one another
    results = {name: hvd.synchronize(handle) for name, handle in handles.items()}
    expected = {"a": sum(1.0 + r for r in range(size)), "b": sum(10.0 * (r + 1)
                                                                 for r in range(size))}
    return {"right": all(bool(results[n].eq(expected[n]).all()) for n in results),
            "then": _then_works()}


def test_ranks_may_submit_named_collectives_in_different_orders() -> None:
    for result in world_of(2).run(_in_opposite_orders):
        assert result == {"right": True, "then": True}


def _same_name_other_shape() -> dict[str, Any]:
    started = time.monotonic()
    try:  # raised where the ranks learn it: here at once, both being on it
        hvd.synchronize(hvd.allreduce_async(torch.ones(3 + hvd.rank()), name="x"))
        raised = "nothing"
    except hvd.CollectiveMismatchError as exc:
        raised = str(exc)
    return {"raised": raised, "seconds": time.monotonic() - started, "then": _then_works()}


def _submitted_by_one_rank_only() -> dict[str, Any]:
    """Rank 0 waits for a name rank 1 never submits, rank 1 waits in a barrier: no rank can
    go on, and each says so at once instead of sitting out the collective timeout."""
    started = time.monotonic()
    try:
        if hvd.rank() == 0:
            hvd.synchronize(hvd.allreduce_async(torch.ones(3), name="only_here"))
        else:
            hvd.barrier()
        raised = "nothing"
    except hvd.CollectiveMismatchError as exc:
        raised = str(exc)
    # rank 1 submits it after all: rank 0's waiting one runs with it, at rank 0's barrier
    if hvd.rank() == 1:
        hvd.synchronize(hvd.allreduce_async(torch.ones(3), name="only_here"))
    hvd.barrier()
    return {"raised": raised, "seconds": time.monotonic() - started, "then": _then_works()}


def test_a_true_mismatch_still_raises_on_every_rank_naming_both_sides() -> None:
    for result in world_of(2).run(_same_name_other_shape):
        assert "tensor shapes" in result["raised"] or "dimensions" in result["raised"], result
        assert "[3]" in result["raised"] and "[4]" in result["raised"], result
        assert result["then"] and result["seconds"] < QUICK_S
    for result in world_of(2).run(_submitted_by_one_rank_only):
        assert result["raised"] == ("the ranks wait on one another: rank 0 waits for "
                                    "'only_here'; rank 1 is in barrier (a named asynchronous "
                                    "collective runs once every rank has submitted it)"), result
        assert result["then"] and result["seconds"] < QUICK_S


def _blocking_in_opposite_orders() -> str:
    rank = hvd.rank()
    try:
        if rank == 0:
            hvd.allreduce(torch.ones(3), name="p")
        else:
            hvd.allreduce(torch.ones(3), name="q")
        return "nothing"
    except hvd.CollectiveMismatchError as exc:
        return str(exc).split(":")[0]
    finally:
        _then_works()


def test_blocking_collectives_keep_their_program_order_check() -> None:
    assert world_of(2).run(_blocking_in_opposite_orders) == ["Mismatched ALLREDUCE names"] * 2
