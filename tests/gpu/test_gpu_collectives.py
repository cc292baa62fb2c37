"""elasticrun.torch's collectives on CUDA tensors: over NCCL (no host round trip) and over
Gloo (through host memory), 3 ranks sharing cuda:0."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.collectives.world import GlooWorld
from tests.gpu import collectives_on_gpu as on_gpu


@pytest.fixture(scope="module", params=["nccl", "gloo"])
def world(request: pytest.FixtureRequest) -> Iterator[GlooWorld]:
    world = GlooWorld(3, backend=request.param)
    yield world
    world.close()


def test_the_round_uses_the_backend_asked_for(world: GlooWorld) -> None:
    assert world.run(on_gpu.where) == [(world.backend, "cuda:0", world.backend == "nccl")] * 3


def test_allreduce_family(world: GlooWorld) -> None:
    for result in world.run(on_gpu.allreduce_family):
        assert all(result.values()), result


def test_gather_scatter_broadcast_adasum(world: GlooWorld) -> None:
    for result in world.run(on_gpu.the_others):
        assert all(result.values()), result


def test_distributed_optimizer_and_state(world: GlooWorld) -> None:
    for result in world.run(on_gpu.optimizer_and_state):
        assert all(result.values()), result


def test_join_serves_cuda_allreduces(world: GlooWorld) -> None:
    assert world.run(on_gpu.join_serves_cuda_allreduces) == [[], [2.0, 2.0], [2.0, 2.0]]


def test_a_commit_on_the_gpu_reads_the_vote_of_the_step_before(world: GlooWorld) -> None:
    assert world.run(on_gpu.commits_read_the_vote_a_step_late) == \
        [([False, False, False, True, True], 0)] * 3
