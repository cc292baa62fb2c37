"""A round's NCCL group, aborted and rebuilt in-process: a collective stuck on a peer that
never comes is released by the abort, the CUDA context survives, and 20 rounds later the
GPU holds no more memory than after the first (within 5%)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.collectives.world import GlooWorld
from tests.gpu import collectives_on_gpu as on_gpu


@pytest.fixture(scope="module")
def world() -> Iterator[GlooWorld]:
    world = GlooWorld(2, backend="nccl")
    yield world
    world.close()


def test_abort_releases_a_stuck_collective_and_the_next_round_works(world: GlooWorld) -> None:
    results = world.run(on_gpu.abort_unblocks_a_stuck_collective)
    assert results[0]["outcome"] == "WorkersFailedError"
    assert results[0]["waited"] < 10.0  # the abort (at 1 s), not a timeout, ended it
    assert all(r["cuda_alive"] and r["next_round"] == 2.0 for r in results), results


def test_no_memory_leaks_over_20_resets(world: GlooWorld) -> None:
    for result in world.run(on_gpu.memory_over_resets, 20):
        (first_used, first_allocated), (last_used, last_allocated) = \
            result["first"], result["last"]
        assert last_used <= first_used * 1.05, result
        assert last_allocated <= first_allocated * 1.05, result
