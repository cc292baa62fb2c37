from __future__ import annotations

import pytest
import torch

import elasticrun.torch as er
from tests.collectives.conftest import world_of
from tests.collectives.world import WorldError


def _sum_of_ranks() -> float:
    return er.allreduce(torch.tensor([float(er.rank())]), op=er.Sum).item()


def _raise_on_one() -> None:
    if er.rank() == 1:
        raise ValueError("boom")


@pytest.mark.parametrize("size", [2, 3])
def test_a_world_runs_collectives_and_reports_errors(size: int) -> None:
    world = world_of(size)
    assert world.run(_sum_of_ranks) == [float(sum(range(size)))] * size
    with pytest.raises(WorldError, match="boom"):
        world.run(_raise_on_one)
    assert world.run(_sum_of_ranks) == [float(sum(range(size)))] * size
