"""The words for ranks that disagree on a collective (pure: tables of requests -> message)."""

from __future__ import annotations

import pytest
import torch

from elasticrun.torch.collectives.requests import Kind, Request, mismatch, stable_hash

F32 = (torch.float32,)


def allreduce(shape: tuple[int, ...] = (4,), **fields: object) -> Request:
    return Request(Kind.ALLREDUCE, dtypes=F32, shapes=(shape,), op="average",
                   **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("requests", "expected"), [
    ({0: allreduce(), 1: allreduce()}, None),
    ({0: allreduce(name="a"), 1: allreduce()}, None),  # an unnamed collective matches any name
    ({0: allreduce(name="a"), 1: allreduce(name="b")},
     "Mismatched ALLREDUCE names: One rank named it 'a', but another rank named it 'b'. "
     "(rank 0: 'a', rank 1: 'b')"),
    ({0: allreduce(), 1: Request(Kind.BROADCAST, dtypes=F32, shapes=((4,),), root=0)},
     "Mismatched operations: One rank did an ALLREDUCE, but another rank did an BROADCAST."),
    ({0: allreduce((2, 3)), 1: allreduce((3, 2))},
     "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [2, 3], but another "
     "rank sent a tensor of shape [3, 2]."),
    ({0: allreduce(), 1: Request(Kind.ALLREDUCE, dtypes=(torch.int32,), shapes=((4,),),
                                 op="average")},
     "Mismatched data types: One rank had type float32, but another rank had type int32."),
    ({0: allreduce(scales=(1.0, 2.0)), 1: allreduce()},
     "Mismatched prescale and/or postscale factors: One rank sent factors (1.0, 2.0), but "
     "another rank sent factors (1.0, 1.0)."),
    ({0: allreduce(), 1: allreduce(device="GPU")},
     "Mismatched ALLREDUCE CPU/GPU device selection: One rank specified device CPU, but "
     "another rank specified device GPU."),
    ({0: allreduce(error="splits do not add up"), 1: allreduce()},
     "the collective could not start on every rank (rank 0: splits do not add up)"),
])
def test_the_first_difference_is_named_in_horovods_words(requests: dict[int, Request],
                                                        expected: str | None) -> None:
    message = mismatch(requests)  # type: ignore[arg-type]
    if expected is None:
        assert message is None
    else:
        assert message is not None and message.startswith(expected), message


def test_allgather_compares_all_but_the_first_dimension() -> None:
    def gather(*shape: int) -> Request:
        return Request(Kind.ALLGATHER, dtypes=F32, shapes=(shape,))

    assert mismatch({0: gather(2, 5), 1: gather(7, 5)}) is None
    assert mismatch({0: gather(2, 5), 1: gather(2, 6)}) == (
        "Mismatched ALLGATHER tensor shapes: One rank sent a tensor with dimension 1 equal to "
        "5, but another rank sent a tensor with dimension 1 equal to 6. (rank 0: 5 (dimension "
        "1), rank 1: 6 (dimension 1))")


def test_a_joined_rank_lets_only_allreduce_and_barrier_run() -> None:
    joined = {0: allreduce(), 1: None}
    assert mismatch(joined, joined=1) is None
    assert mismatch({0: Request(Kind.BARRIER), 1: None}, joined=1) is None
    assert mismatch({0: Request(Kind.BROADCAST, root=0), 1: None}, joined=1) == \
        "Broadcast is not supported with Join at this time."


def test_many_ranks_are_named_by_value() -> None:
    requests = {r: allreduce((4,) if r != 5 else (5,)) for r in range(20)}
    message = mismatch(requests)  # type: ignore[arg-type]
    assert message is not None
    assert message.endswith("(ranks 0, 1, 2, 3, 4, 6, 7, 8, ...: [4]; rank 5: [5])"), message


def test_the_hash_is_the_same_in_every_process() -> None:
    assert stable_hash("allreduce") == stable_hash("allreduce") < 2 ** 61
    assert stable_hash("a") != stable_hash("b")
