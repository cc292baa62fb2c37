"""Two of Horovod's behaviours at the collectives' edge, on real Gloo ranks: reducescatter
with an op other than Average and Sum raises a RuntimeError in Horovod's words on every rank,
before any data moves (not a failed peer: the next collective works); ranks on different
operations are told the operations differ, whatever the operations' shapes."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import elasticrun.torch as hvd
from elasticrun.torch.collectives.requests import Kind, Request, mismatch
from elasticrun.worker.elastic import WorkersFailedError
from tests.collectives.conftest import world_of

HOROVOD_WORDS = "Reducescatter currently only supports AVERAGE and SUM."
OPERATIONS = "Mismatched operations: One rank did an ALLGATHER, but another rank did an BARRIER."


def _then_works() -> bool:
    return bool(hvd.allreduce(torch.ones(3), op=hvd.Sum).eq(hvd.size()).all())


def _raised(call: Any) -> tuple[str, str, bool]:
    """(the exception's type and message, its classes, whether it is a peer failure)."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the test looks at what was raised
        return (f"{type(exc).__name__}: {exc}",
                ",".join(c.__name__ for c in type(exc).__mro__),
                isinstance(exc, WorkersFailedError))
    return "nothing", "", False


def _reducescatter_ops() -> list[tuple[str, str, bool, bool]]:
    """Every unsupported op on every rank (Horovod's test: op=Adasum): what each raised, and
    whether the next collective, a supported reducescatter, worked."""
    results = []
    for op in (hvd.Adasum, hvd.Min, hvd.Max, hvd.Product):
        raised, classes, failure = _raised(
            lambda op=op: hvd.reducescatter(torch.ones(4 * hvd.size(), 3), op=op))
        back = hvd.reducescatter(torch.ones(4 * hvd.size(), 3), op=hvd.Sum)
        results.append((raised, classes, failure,
                        bool(back.eq(hvd.size()).all()) and _then_works()))
    return results


@pytest.mark.parametrize("size", [2])
def test_reducescatter_other_ops_raise_horovods_runtime_error_on_every_rank(size: int) -> None:
    for rank, results in enumerate(world_of(size).run(_reducescatter_ops)):
        for raised, classes, failure, then in results:
            assert raised.endswith(HOROVOD_WORDS), (rank, raised)
            assert "RuntimeError" in classes.split(","), (rank, classes)
            assert not failure and then, (rank, raised)


def _grouped_adasum() -> tuple[str, bool]:
    raised, _, _ = _raised(lambda: hvd.grouped_reducescatter([torch.ones(4, 2)] * 2,
                                                              op=hvd.Adasum))
    return raised, _then_works()


def test_grouped_reducescatter_adasum_raises_the_same() -> None:
    for raised, then in world_of(2).run(_grouped_adasum):
        assert raised.endswith(HOROVOD_WORDS) and then, raised


def _allgather_or_barrier_in_a_set() -> tuple[str, bool]:
    """Ranks 0 and 1 of a process set (negotiated within the set, where no named collective
    waits): rank 0 allgathers, rank 1 is at a barrier; rank 2 is outside."""
    pair = hvd.add_process_set([0, 1])
    raised = "outside"
    if hvd.rank() < 2:
        raised, _, _ = _raised(lambda: hvd.allgather(torch.ones(2, 3), process_set=pair)
                               if hvd.rank() == 0 else hvd.barrier(process_set=pair))
    hvd.remove_process_set(pair)
    return raised, _then_works()


def test_allgather_against_barrier_names_the_operations() -> None:
    results = world_of(3).run(_allgather_or_barrier_in_a_set)
    for rank, (raised, _) in enumerate(results[:2]):
        assert raised.startswith(f"CollectiveMismatchError: {OPERATIONS}"), (rank, raised)
    assert results[2][0] == "outside" and all(then for _, then in results), results


def _allgather(*shapes: tuple[int, ...]) -> Request:
    return Request(Kind.ALLGATHER, dtypes=(torch.float32,) * len(shapes), shapes=shapes)


@pytest.mark.parametrize(("requests", "expected"), [
    ({0: _allgather((2, 3)), 1: Request(Kind.BARRIER)}, OPERATIONS),
    ({0: _allgather((2, 3)), 1: Request(Kind.BARRIER), 2: _allgather((2, 4))}, OPERATIONS),
    ({0: _allgather((2, 3)), 1: _allgather()},
     "Mismatched ALLGATHER tensor counts: One rank sent 1 tensor(s), but another rank sent 0."),
])
def test_the_first_dimension_is_compared_only_once_operations_and_counts_agree(
        requests: dict[int, Request], expected: str) -> None:
    message = mismatch(requests)  # type: ignore[arg-type]
    assert message is not None and message.startswith(expected), message
