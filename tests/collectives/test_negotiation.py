"""Ranks that disagree on a collective are told so before any data moves, on every rank and
in Horovod's words, and the job goes on: the next collective works. Real Gloo ranks; the
world's collective timeout is 15 s, which a desynchronised job would sit out."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

import elasticrun.torch as hvd
from tests.collectives.conftest import world_of

QUICK_S = 5.0  # far below the 15 s a desynchronised collective would wait


def _then_works() -> bool:
    """The job is usable: an allreduce after the failed collective gives the right sum."""
    return bool(hvd.allreduce(torch.ones(3), op=hvd.Sum).eq(hvd.size()).all())


def _disagree(case: str) -> dict[str, Any]:
    """Every rank runs its side of `case`: what each raised, how fast, and whether the next
    collective worked."""
    rank = hvd.rank()
    calls: dict[str, Callable[[], Any]] = {
        "dtype": lambda: hvd.allreduce(torch.ones(4, dtype=torch.int32 if rank % 2 else
                                                  torch.float32)),
        "shape": lambda: hvd.allreduce(torch.ones([17 + (rank % 2)] * 3)),
        "rank": lambda: hvd.allreduce(torch.ones(17, 23 * 57) if rank == 0 else
                                      torch.ones(17, 23, 57)),
        "operation": lambda: hvd.allreduce(torch.ones(4)) if rank == 0 else
        hvd.allgather(torch.ones(4)),
        "root": lambda: hvd.broadcast(torch.ones(4), root_rank=rank % 2),
        "allgather dimension": lambda: hvd.allgather(torch.ones(2 + rank, 3 + (rank % 2))),
        "reduce op": lambda: hvd.allreduce(torch.ones(4), op=hvd.Min if rank else hvd.Sum),
        "scales": lambda: hvd.allreduce(torch.ones(4), prescale_factor=1.0 + (rank % 2)),
        "name": lambda: hvd.allreduce(torch.ones(4), name=f"metric-{rank % 2}"),
        "splits": lambda: hvd.alltoall(torch.ones(4, 2), splits=[4] + [0] * (hvd.size() - 1)
                                       if rank != 1 else [1] * (hvd.size() + 1)),
    }
    started = time.monotonic()
    try:
        calls[case]()
        raised = "nothing"
    except Exception as exc:  # noqa: BLE001 - the test looks at what was raised
        raised = f"{type(exc).__name__}: {exc}"
    return {"raised": raised, "seconds": time.monotonic() - started,
            "then": _then_works()}


EXPECTED = {  # what every rank's message says (Horovod's wording)
    "dtype": "Mismatched data types: One rank had type",
    "shape": "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [17, 17, 17]",
    "rank": "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of rank 2, but another "
            "rank sent a tensor of rank 3",
    "operation": "Mismatched operations: One rank did an ALLREDUCE, but another rank did an "
                 "ALLGATHER",
    "root": "Mismatched BROADCAST root ranks: One rank specified root rank 0, but another rank "
            "specified root rank 1",
    "allgather dimension": "Mismatched ALLGATHER tensor shapes: One rank sent a tensor with "
                           "dimension 1 equal to 3, but another rank sent a tensor with "
                           "dimension 1 equal to 4",
    "reduce op": "Mismatched reduction operation: One rank sent reduction op sum, but another "
                 "rank sent reduction op min",
    "scales": "Mismatched prescale and/or postscale factors",
    "name": "Mismatched ALLREDUCE names",
}


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_ranks_that_disagree_all_raise_at_once_and_the_job_goes_on(case: str,
                                                                  size: int) -> None:
    results = world_of(size).run(_disagree, case)
    for rank, result in enumerate(results):
        assert result["raised"].startswith("CollectiveMismatchError: "), (rank, result)
        assert EXPECTED[case] in result["raised"], (rank, result)
        assert "rank 0" in result["raised"] and "rank 1" in result["raised"]  # who sent what
        assert result["seconds"] < QUICK_S and result["then"], (rank, result)


def test_a_rank_that_cannot_start_raises_its_own_error_and_the_others_name_it() -> None:
    results = world_of(3).run(_disagree, "splits")
    assert results[1]["raised"].startswith("ValueError: alltoall splits")
    for rank in (0, 2):
        assert results[rank]["raised"].startswith("CollectiveMismatchError: the collective "
                                                  "could not start on every rank (rank 1: ")
    assert all(r["then"] and r["seconds"] < QUICK_S for r in results), results


def _duplicate_name() -> tuple[str, bool]:
    first = hvd.allreduce_async(torch.ones(4), name="dup")
    try:
        hvd.allreduce_async(torch.ones(4), name="dup")
        raised = "nothing"
    except ValueError as exc:
        raised = str(exc)
    hvd.synchronize(first)
    hvd.synchronize(hvd.allreduce_async(torch.ones(4), name="dup"))  # free again
    return raised, _then_works()


def test_a_name_in_flight_cannot_be_used_again_until_synchronized() -> None:
    for raised, then in world_of(2).run(_duplicate_name):
        assert "the same name as another tensor that is currently being processed" in raised
        assert then


# --- every dtype Horovod has on CPU, through every collective, exact ------------------------
DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.bool]


def _values(rank: int, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    """Small values every rank can make for any rank (exact in every dtype)."""
    base = torch.arange(int(torch.tensor(shape).prod())).reshape(shape) + 3 * rank
    if dtype == torch.bool:
        return (base % 3 == 0)
    return (base % 7).to(dtype)


def _every_dtype(dtype: torch.dtype) -> list[str]:
    rank, size = hvd.rank(), hvd.size()
    everyone = [_values(r, dtype, 4, 3) for r in range(size)]
    stacked = torch.stack([t.to(torch.int64) for t in everyone])
    wrong = []

    def check(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
        if got.dtype != dtype or got.shape != want.shape or not torch.equal(got, want.to(dtype)):
            wrong.append(f"{what}: {got} != {want}")

    if dtype == torch.bool:
        check("Sum (any)", hvd.allreduce(everyone[rank], op=hvd.Sum), stacked.sum(0) != 0)
        check("Min (all)", hvd.allreduce(everyone[rank], op=hvd.Min), stacked.min(0).values != 0)
        check("Max (any)", hvd.allreduce(everyone[rank], op=hvd.Max), stacked.max(0).values != 0)
    else:
        check("Sum", hvd.allreduce(everyone[rank], op=hvd.Sum), stacked.sum(0))
        check("Min", hvd.allreduce(everyone[rank], op=hvd.Min), stacked.min(0).values)
        check("Max", hvd.allreduce(everyone[rank], op=hvd.Max), stacked.max(0).values)
        # Horovod's Average: the sum scaled by 1/size, in the dtype (integers in double,
        # truncated toward zero)
        average = (stacked.sum(0).to(dtype).mul_(1.0 / size) if dtype.is_floating_point
                   else (stacked.sum(0).double() * (1.0 / size)).to(dtype))
        check("Average", hvd.allreduce(everyone[rank]), average)
        share = hvd.reducescatter(everyone[rank], op=hvd.Sum)
        rows = stacked.sum(0)
        offset = 0 if rank == 0 else (rank * (4 // size) + min(rank, 4 % size))
        check("reducescatter", share, rows[offset:offset + share.shape[0]])
    check("broadcast", hvd.broadcast(everyone[rank], root_rank=size - 1), everyone[size - 1])
    check("allgather", hvd.allgather(everyone[rank]), torch.cat(everyone))
    sent = torch.cat([everyone[rank][r:r + 1] for r in range(size)])
    check("alltoall", hvd.alltoall(sent), torch.cat([everyone[r][rank:rank + 1]
                                                     for r in range(size)]))
    return wrong


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d).removeprefix("torch.") for d in DTYPES])
def test_every_dtype_goes_through_every_collective_exactly(dtype: torch.dtype) -> None:
    assert world_of(3).run(_every_dtype, dtype) == [[]] * 3


# --- join: Horovod's results ------------------------------------------------------------------
def _join_results(dtype: torch.dtype) -> dict[str, Any]:
    """Rank 0 joins at once; the others reduce with every op: the joined rank contributes
    zeros (as Horovod's), and Average divides by the full size (integers truncated)."""
    rank, size = hvd.rank(), hvd.size()
    results: dict[str, Any] = {}
    if rank == 0:
        results["last"] = hvd.join()
        return results
    mine = (torch.arange(6) - 2 + rank).reshape(2, 3).to(dtype)
    others = [(torch.arange(6) - 2 + r).reshape(2, 3).to(dtype) for r in range(1, size)]
    everyone = torch.stack([torch.zeros(2, 3, dtype=dtype), *others])
    total = everyone.sum(0)
    expected = {
        "Sum": total,
        "Min": everyone.min(0).values,
        "Max": everyone.max(0).values,
        # divided by the full size, the joined rank counted; integers truncated
        "Average": (total.clone().mul_(1.0 / size) if dtype.is_floating_point
                    else (total.double() * (1.0 / size)).to(dtype)),
    }
    for name, op in (("Sum", hvd.Sum), ("Min", hvd.Min), ("Max", hvd.Max),
                     ("Average", hvd.Average)):
        results[name] = torch.equal(hvd.allreduce(mine, op=op), expected[name])
    try:
        hvd.allgather(mine)
        results["allgather"] = "nothing"
    except RuntimeError as exc:
        results["allgather"] = str(exc)
    results["last"] = hvd.join()
    return results


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32],
                         ids=["int32", "int64", "float32"])
def test_join_gives_horovods_results_for_every_op(dtype: torch.dtype) -> None:
    results = world_of(3).run(_join_results, dtype)
    assert {r["last"] for r in results} == {2}  # the last to join, on every rank
    for result in results[1:]:
        assert all(result[op] is True for op in ("Sum", "Min", "Max", "Average")), result
        assert result["allgather"] == "Allgather is not supported with Join at this time."
