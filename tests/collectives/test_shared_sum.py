"""Buckets summed through shared memory (every rank on one machine), on real ranks: the sums
are Gloo's, every rank ends with the same bits, a rank that cannot map leaves every rank on
Gloo, a late peer is waited for in bounded slices, an aborted round releases the wait, and
DistributedOptimizer takes this path unless ELASTICRUN_SHARED_MEMORY=0."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
import torch
from torch import nn

import elasticrun.torch as hvd
from elasticrun.torch.collectives import shared_sum
from elasticrun.torch.world import runtime
from elasticrun.worker.elastic import WorkersFailedError
from tests.collectives.conftest import world_of
from tests.collectives.world import COLLECTIVE_TIMEOUT_S, GlooWorld

pytestmark = pytest.mark.skipif(not shared_sum.eligible_machine(),
                                reason="shared-memory sums need x86-64 Linux")

SIZES = ((1, torch.float32), (2, torch.float32), (1000, torch.float32),
         (4099, torch.float64), (515, torch.float16))


def _connected() -> tuple[list[shared_sum.SharedBuffer], shared_sum.SharedBuckets]:
    buffers = [shared_sum.SharedBuffer(numel, dtype) for numel, dtype in SIZES]
    shared = shared_sum.connect(buffers, len(buffers))
    assert shared is not None
    return buffers, shared


def check_sums_equal_gloo_and_every_rank_alike() -> bool:
    buffers, shared = _connected()
    generator = torch.Generator().manual_seed(hvd.rank())
    for _ in range(5):  # in a row: the counters go on from sum to sum
        inputs = [torch.randn(b.numel, generator=generator).to(b.dtype) for b in buffers]
        for buffer, values in zip(buffers, inputs, strict=True):
            buffer.data.copy_(values)
        works = [shared_sum.Waiting(shared.start(i)) for i in range(len(buffers))]
        for work in reversed(works):  # the order of the waits does not matter
            work.wait()
        for buffer, values in zip(buffers, inputs, strict=True):
            expected = hvd.allreduce(values, op=hvd.Sum)
            tolerance = 1e-2 if buffer.dtype == torch.float16 else 1e-5
            assert torch.allclose(buffer.data, expected, atol=tolerance), buffer.numel
        digests = hvd.allgather_object([b.data.double().sum().item() for b in buffers])
        assert all(d == digests[0] for d in digests), digests
    return True


def check_one_rank_that_cannot_map_leaves_every_rank_on_gloo() -> bool:
    """Rank 1 fails to open its peers' memory (as where /proc hides other processes); the
    others open theirs, and still give up with it."""
    buffer = shared_sum.SharedBuffer(64, torch.float32)
    peer = shared_sum._Peer

    def unopenable(pid: int, fd: int, numel: int, dtype: torch.dtype) -> shared_sum._Peer:
        raise PermissionError(f"/proc/{pid}/fd/{fd}")

    if hvd.rank() == 1:
        shared_sum._Peer = unopenable  # type: ignore[assignment,misc]
    try:
        return shared_sum.connect([buffer], 1) is None
    finally:
        shared_sum._Peer = peer  # type: ignore[misc]


def check_a_late_peer_is_waited_for_in_slices() -> dict[str, object]:
    buffers, shared = _connected()
    buffers[2].data.fill_(float(hvd.rank() + 1))
    hvd.barrier()
    if hvd.rank() == 2:
        time.sleep(1.0)
    work = shared.start(2)
    timeouts = 0
    while True:
        try:
            work.wait(timedelta(milliseconds=100))
            break
        except RuntimeError:
            timeouts += 1
    total = float(sum(range(1, hvd.size() + 1)))
    return {"timeouts": timeouts, "summed": bool((buffers[2].data == total).all())}


def _released_by_abort(rank: int) -> dict[str, object]:
    buffers = [shared_sum.SharedBuffer(1 << 12, torch.float32)]
    shared = shared_sum.connect(buffers, 1)
    assert shared is not None
    if rank == 2:  # alive, mapped, but never sums
        time.sleep(3.0)
        return {}
    session = runtime.current().session
    assert session is not None
    threading.Timer(0.5, session.abort).start()
    started = time.monotonic()
    try:
        shared_sum.Waiting(shared.start(0)).wait()
        outcome = "returned"
    except WorkersFailedError as exc:
        outcome = str(exc)
    return {"outcome": outcome, "released_s": time.monotonic() - started}


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 40), nn.ReLU(), nn.Linear(40, 5))


@contextmanager
def _shared_memory_env(value: str | None) -> Iterator[None]:
    """ELASTICRUN_SHARED_MEMORY set to `value` (None: left as it is) in this worker, then
    restored."""
    before = os.environ.get(shared_sum.ENV_DISABLE)
    if value is not None:
        os.environ[shared_sum.ENV_DISABLE] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(shared_sum.ENV_DISABLE, None)
        else:
            os.environ[shared_sum.ENV_DISABLE] = before


def _train(shared: bool) -> tuple[bool, list[torch.Tensor]]:
    with _shared_memory_env("1" if shared else "0"):
        model = _mlp()
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters())
        generator = torch.Generator().manual_seed(hvd.rank())
        for _ in range(4):
            optimizer.zero_grad()
            x, y = torch.randn(6, 12, generator=generator), torch.randint(0, 5, (6,))
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        used = optimizer._er_reduction.sharing.shared is not None  # type: ignore[attr-defined]
        return used, [p.detach().clone() for p in model.parameters()]


def check_the_optimizer_sums_in_shared_memory_unless_told_not_to() -> bool:
    used, shared = _train(True)
    unused, gloo = _train(False)
    assert used and not unused, (used, unused)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(shared, gloo, strict=True))
    digests = hvd.allgather_object([p.sum().item() for p in shared])
    assert all(d == digests[0] for d in digests), digests
    return True


def test_sums_equal_gloo_and_every_rank_ends_alike() -> None:
    assert world_of(3).run(check_sums_equal_gloo_and_every_rank_alike) == [True] * 3


def test_a_rank_that_cannot_map_leaves_every_rank_on_gloo() -> None:
    assert world_of(3).run(check_one_rank_that_cannot_map_leaves_every_rank_on_gloo) \
        == [True] * 3


def test_a_late_peer_is_waited_for_in_bounded_slices() -> None:
    results = world_of(3).run(check_a_late_peer_is_waited_for_in_slices)
    assert all(r["summed"] for r in results), results
    # ranks 0 and 1 waited ~1 s for rank 2: their 100 ms slices ran out, and went on
    assert all(int(r["timeouts"]) >= 3 for r in results[:2]), results


def test_an_aborted_round_releases_a_shared_memory_sum() -> None:
    world = GlooWorld(3)  # not a shared one: its round is aborted
    try:
        results = world.run_per_rank(_released_by_abort, [(0,), (1,), (2,)])
    finally:
        world.close()
    for result in results[:2]:
        assert "broke while a collective was in flight" in str(result["outcome"]), result
        assert float(result["released_s"]) < COLLECTIVE_TIMEOUT_S / 3, result


def test_distributed_optimizer_sums_in_shared_memory_unless_disabled() -> None:
    assert world_of(2).run(check_the_optimizer_sums_in_shared_memory_unless_told_not_to) \
        == [True] * 2


def check_a_rank_that_does_not_want_it_leaves_every_rank_on_gloo() -> bool:
    with _shared_memory_env("0" if hvd.rank() == 1 else None):
        buffers = [shared_sum.SharedBuffer(8, torch.float32)] if shared_sum.wanted() else []
        return shared_sum.connect(buffers, 1) is None


def test_a_rank_that_does_not_want_it_leaves_every_rank_on_gloo() -> None:
    assert world_of(3).run(check_a_rank_that_does_not_want_it_leaves_every_rank_on_gloo) \
        == [True] * 3
