"""Every horovod.torch collective on 2, 3 and 4 real Gloo ranks against a single-process
reference: each rank makes every rank's inputs from the same seeds, so it can compute what
the collective must return without communicating."""

from __future__ import annotations

import pytest
import torch

import elasticrun.torch as hvd
from elasticrun.job.errors import NotSupportedError
from tests.collectives.conftest import world_of

SIZES = [2, 3, 4]


def _data(rank: int, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + rank)
    values = torch.randn(*shape, generator=generator)
    return values.to(dtype) if dtype.is_floating_point else (values * 10).to(dtype)


def _equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.allclose(got.double(), want.double(), rtol=1e-5, atol=1e-5), \
        f"{what}: {got} != {want}"


def check_allreduce_family() -> bool:
    rank, size = hvd.rank(), hvd.size()
    everyone = [_data(r, 3, 5) for r in range(size)]
    mine = everyone[rank]
    total = torch.stack(everyone).sum(0)
    _equal(hvd.allreduce(mine), total / size, "Average (default)")
    _equal(hvd.allreduce(mine, op=hvd.Sum), total, "Sum")
    _equal(hvd.allreduce(mine, op=hvd.Min), torch.stack(everyone).min(0).values, "Min")
    _equal(hvd.allreduce(mine, op=hvd.Max), torch.stack(everyone).max(0).values, "Max")
    _equal(hvd.allreduce(mine, op=hvd.Product), torch.stack(everyone).prod(0), "Product")
    with pytest.warns(DeprecationWarning):
        _equal(hvd.allreduce(mine, average=False), total, "average=False")
    with pytest.raises(ValueError, match="supersedes average"):
        hvd.allreduce(mine, average=True, op=hvd.Sum)
    _equal(hvd.allreduce(mine, name="metric", op=hvd.Sum, prescale_factor=2.0,
                         postscale_factor=0.5), total, "pre/postscale")
    assert torch.equal(mine, everyone[rank]), "allreduce must not modify its input"
    # in place, async with poll/synchronize
    copy = mine.clone()
    assert hvd.allreduce_(copy, op=hvd.Sum) is copy
    _equal(copy, total, "allreduce_")
    handle = hvd.allreduce_async(mine, op=hvd.Sum)
    while not hvd.poll(handle):
        pass
    _equal(hvd.synchronize(handle), total, "allreduce_async")
    inplace = mine.clone()
    _equal(hvd.synchronize(hvd.allreduce_async_(inplace)), total / size, "allreduce_async_")
    _equal(inplace, total / size, "allreduce_async_ in place")
    # integers average truncated toward zero, as Horovod (its sum scaled by 1/size in double)
    ints = [_data(r, 4, dtype=torch.int64) for r in range(size)]
    _equal(hvd.allreduce(ints[rank]), torch.stack(ints).sum(0).div(size, rounding_mode="trunc"),
           "int Average")
    # grouped: fused, several dtypes and shapes, non-contiguous
    group = [_data(rank, 2, 3), _data(rank + 10, 7), _data(rank + 20, 4, 4).t(),
             _data(rank + 30, 3, dtype=torch.float64)]
    refs = [torch.stack([_data(r, 2, 3) for r in range(size)]).sum(0),
            torch.stack([_data(r + 10, 7) for r in range(size)]).sum(0),
            torch.stack([_data(r + 20, 4, 4).t() for r in range(size)]).sum(0),
            torch.stack([_data(r + 30, 3, dtype=torch.float64) for r in range(size)]).sum(0)]
    for got, want in zip(hvd.grouped_allreduce(group, op=hvd.Sum), refs, strict=True):
        _equal(got, want, "grouped_allreduce")
    handle = hvd.grouped_allreduce_async(group, op=hvd.Sum)
    for got, want in zip(hvd.synchronize(handle), refs, strict=True):
        _equal(got, want, "grouped_allreduce_async")
    hvd.grouped_allreduce_(group)
    for got, want in zip(group, refs, strict=True):
        _equal(got, want / size, "grouped_allreduce_")
    # fp16 compression: travels as half, comes back as float32
    compressed = hvd.allreduce(mine, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert compressed.dtype == torch.float32
    assert torch.allclose(compressed, total, atol=1e-2, rtol=1e-2)
    # the gradient of an allreduce is the same allreduce of the output's gradient
    leaf = mine.clone().requires_grad_()
    (hvd.allreduce(leaf, op=hvd.Sum) * (rank + 1)).sum().backward()
    _equal(leaf.grad, torch.full_like(mine, float(sum(range(1, size + 1)))), "allreduce grad")
    return True


def check_gather_scatter() -> bool:
    rank, size = hvd.rank(), hvd.size()
    rows = [_data(r, r + 1, 3) for r in range(size)]  # a different first dimension per rank
    _equal(hvd.allgather(rows[rank]), torch.cat(rows), "allgather (uneven)")
    _equal(hvd.synchronize(hvd.allgather_async(rows[rank], name="g")), torch.cat(rows),
           "allgather_async")
    empty_ok = torch.zeros(0 if rank == 0 else 2, 3)
    assert hvd.allgather(empty_ok).shape == (2 * (size - 1), 3)
    leaf = rows[rank].clone().requires_grad_()
    hvd.allgather(leaf).sum().backward()  # Horovod: averaged over ranks, then this rank's rows
    _equal(leaf.grad, torch.ones_like(rows[rank]), "allgather grad")
    assert hvd.allgather_object({"rank": rank}) == [{"rank": r} for r in range(size)]
    assert hvd.allgather_object("x" * 1000 * rank) == ["x" * 1000 * r for r in range(size)]
    # broadcast, from a root other than 0
    root = size - 1
    _equal(hvd.broadcast(_data(rank, 4), root_rank=root), _data(root, 4), "broadcast")
    target = _data(rank, 4)
    hvd.broadcast_(target, root)
    _equal(target, _data(root, 4), "broadcast_")
    _equal(hvd.synchronize(hvd.broadcast_async(_data(rank, 2, 2), 0)), _data(0, 2, 2),
           "broadcast_async")
    assert hvd.broadcast_object({"from": rank}, root_rank=root) == {"from": root}
    assert hvd.broadcast_object(list(range(1000 * rank)), root_rank=root) == \
        list(range(1000 * root))
    # alltoall with uneven splits: rank s sends (s + d) % 3 rows to rank d
    def splits_of(sender: int) -> list[int]:
        return [(sender + dest) % 3 for dest in range(size)]

    def sent(sender: int) -> torch.Tensor:
        return _data(100 + sender, sum(splits_of(sender)), 2)

    output, received = hvd.alltoall(sent(rank), splits=torch.tensor(splits_of(rank)))
    expected = []
    for sender in range(size):
        start = sum(splits_of(sender)[:rank])
        expected.append(sent(sender)[start:start + splits_of(sender)[rank]])
    _equal(output, torch.cat(expected), "alltoall (splits)")
    assert received.tolist() == [splits_of(s)[rank] for s in range(size)]
    even = _data(200 + rank, 2 * size, 3)
    got = hvd.alltoall(even)
    _equal(got, torch.cat([_data(200 + s, 2 * size, 3)[2 * rank:2 * rank + 2]
                           for s in range(size)]), "alltoall (equal parts)")
    # reducescatter: 2*size+1 rows, the first rank gets one more
    matrices = [_data(300 + r, 2 * size + 1, 2) for r in range(size)]
    total = torch.stack(matrices).sum(0)
    first = 3 if rank == 0 else 2
    offset = 0 if rank == 0 else 3 + 2 * (rank - 1)
    _equal(hvd.reducescatter(matrices[rank], op=hvd.Sum), total[offset:offset + first],
           "reducescatter Sum")
    _equal(hvd.reducescatter(matrices[rank]), total[offset:offset + first] / size,
           "reducescatter Average")
    hvd.barrier()
    return True


def check_join_with_uneven_batches() -> list[float]:
    """Rank r has r + 1 batches; each step averages a value over all ranks; then join."""
    rank, size = hvd.rank(), hvd.size()
    averages = []
    for step in range(rank + 1):
        value = torch.tensor([float(step + 1)])
        averages.append(hvd.allreduce(value, name="loss").item())
    last = hvd.join()
    assert last == size - 1, f"join() returned {last}; the last to join was rank {size - 1}"
    # after everybody joined, collectives work normally again
    assert hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item() == size
    return averages


def check_only_allreduce_runs_beside_a_joined_rank() -> str:
    if hvd.rank() == 0:
        hvd.join()
        return "joined"
    try:
        hvd.broadcast(torch.zeros(2), root_rank=1)
    except RuntimeError as exc:  # as Horovod: a RuntimeError
        message = f"{type(exc).__name__}: {exc}"
    else:
        message = "no error"
    hvd.join()
    return message


def check_unsupported_and_queries() -> bool:
    with pytest.raises(ValueError, match="is not initialised"):
        hvd.allreduce(torch.ones(1), process_set=hvd.ProcessSet([0]))
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum,
                         process_set=hvd.global_process_set).item() == hvd.size()
    with pytest.raises(ValueError, match="MPI"):
        hvd.mpi_threads_supported()
    assert (hvd.gloo_built(), hvd.gloo_enabled(), hvd.mpi_built(), hvd.mpi_enabled(),
            hvd.is_initialized()) == (True, True, False, False, True)
    # answered for the torch installed (the CPU wheel in CI has neither)
    assert hvd.nccl_built() == torch.distributed.is_nccl_available()
    assert hvd.cuda_built() == (torch.version.cuda is not None)
    assert hvd.is_homogeneous()
    with pytest.raises(NotSupportedError, match="compiled extension"):
        hvd.mpi_lib  # noqa: B018
    return True


@pytest.mark.parametrize("size", SIZES)
def test_allreduce_family_matches_the_reference(size: int) -> None:
    assert world_of(size).run(check_allreduce_family) == [True] * size


@pytest.mark.parametrize("size", SIZES)
def test_gather_broadcast_alltoall_reducescatter_match_the_reference(size: int) -> None:
    assert world_of(size).run(check_gather_scatter) == [True] * size


@pytest.mark.parametrize("size", SIZES)
def test_join_serves_the_ranks_that_still_have_data(size: int) -> None:
    averages = world_of(size).run(check_join_with_uneven_batches)
    # at step k the ranks with more than k batches contribute k + 1; Average divides by size
    for rank, seen in enumerate(averages):
        expected = [(step + 1) * (size - step) / size for step in range(rank + 1)]
        assert seen == pytest.approx(expected), f"rank {rank}"


def test_a_collective_other_than_allreduce_beside_a_joined_rank_is_refused() -> None:
    results = world_of(3).run(check_only_allreduce_runs_beside_a_joined_rank)
    assert results[0] == "joined"
    assert all(r == "CollectiveMismatchError: Broadcast is not supported with Join at this "
               "time." for r in results[1:]), results


def test_unsupported_features_say_so_and_queries_answer() -> None:
    assert world_of(2).run(check_unsupported_and_queries) == [True, True]


def _die_soon() -> str:
    import os
    import threading

    threading.Timer(0.3, lambda: os._exit(0)).start()
    return "dying"


def check_every_collective_fails_typed_after_a_peer_died() -> dict[str, str]:
    import time

    from elasticrun.torch.elastic import WorkersFailedError

    time.sleep(1.5)  # the peer is gone: its sockets are closed
    calls = {
        "allreduce": lambda: hvd.allreduce(torch.ones(3), name="metric"),
        "allreduce_async": lambda: hvd.synchronize(hvd.allreduce_async(torch.ones(3))),
        "grouped_allreduce": lambda: hvd.grouped_allreduce([torch.ones(3), torch.ones(2)]),
        "adasum": lambda: hvd.allreduce(torch.ones(3), op=hvd.Adasum),
        "allgather": lambda: hvd.allgather(torch.ones(2, 2)),
        "broadcast": lambda: hvd.broadcast(torch.ones(2), 0),
        "alltoall": lambda: hvd.alltoall(torch.ones(2)),
        "reducescatter": lambda: hvd.reducescatter(torch.ones(4)),
        "barrier": hvd.barrier,
        "join": hvd.join,
        "broadcast_object": lambda: hvd.broadcast_object(1),
        "allgather_object": lambda: hvd.allgather_object(1),
        "broadcast_parameters": lambda: hvd.broadcast_parameters([torch.ones(2)]),
    }
    outcome = {}
    for name, call in calls.items():
        try:
            call()
        except WorkersFailedError:
            outcome[name] = "WorkersFailedError"
        except Exception as exc:  # noqa: BLE001 - reported to the test
            outcome[name] = f"{type(exc).__name__}: {exc}"
        else:
            outcome[name] = "returned"
    return outcome


def test_a_dead_peer_makes_every_collective_raise_workers_failed_error() -> None:
    from tests.collectives.world import GlooWorld

    world = GlooWorld(2)  # not a shared one: rank 1 dies
    try:
        results = world.run_per_rank(_dispatch_death, [(0,), (1,)])
    finally:
        world.close()
    outcome = results[0]
    assert outcome == dict.fromkeys(outcome, "WorkersFailedError"), outcome


def _dispatch_death(rank: int) -> object:
    return _die_soon() if rank == 1 else check_every_collective_fails_typed_after_a_peer_died()
