"""DistributedOptimizer's buckets are DDP's: for one dtype, the same split as torch's own
Reducer computes (`_compute_bucket_assignment_by_size`, given the parameters in the order
their gradients arrive), so that a step issues as many collectives as DDP's."""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist

from elasticrun.torch.optimizer.buckets import layout, split_by_size

MIB = 1024 * 1024


def ddp_split(backwards: list[torch.Tensor], first: int, cap: int) -> list[list[int]]:
    indices, _ = dist._compute_bucket_assignment_by_size(
        backwards, [first, cap], [False] * len(backwards))
    return [list(bucket) for bucket in indices]


def ours(backwards: list[torch.Tensor], first: int, cap: int) -> list[list[int]]:
    where = {id(p): i for i, p in enumerate(backwards)}
    return [[where[id(p)] for p in bucket] for bucket in split_by_size(backwards, first, cap)]


def mlp(width: int) -> list[torch.Tensor]:
    """The benchmarks' MLP (64 -> width -> width -> 10), backwards, on the meta device."""
    sizes = (64 * width, width, width * width, width, width * 10, 10)
    return [torch.empty(n, device="meta") for n in reversed(sizes)]


@pytest.mark.parametrize("width", [100, 1000, 3162, 7071])
def test_the_mlps_split_as_ddp_splits_them(width: int) -> None:
    params = mlp(width)
    assert ours(params, MIB, 25 * MIB) == ddp_split(params, MIB, 25 * MIB)
    assert ours(params, 25 * MIB, 25 * MIB) == ddp_split(params, 25 * MIB, 25 * MIB)


def test_a_layer_larger_than_the_first_limit_closes_the_first_bucket() -> None:
    # 10M parameters: the big layer joins the small last layer's bucket, as in DDP (two
    # collectives a step, not three)
    params = mlp(3162)
    assert ours(params, MIB, 25 * MIB) == [[0, 1, 2, 3], [4, 5]]


def test_random_models_split_as_ddp_splits_them() -> None:
    rng = random.Random(7)
    for _ in range(200):
        params = [torch.empty(rng.choice([1, 10, 1000, 50_000, 400_000]), device="meta")
                  for _ in range(rng.randint(1, 30))]
        first, cap = rng.choice([(400, 4000), (MIB, 25 * MIB), (40_000, 40_000)])
        assert ours(params, first, cap) == ddp_split(params, first, cap), \
            [p.numel() for p in params]


def test_a_new_dtype_starts_a_new_bucket() -> None:
    params = [torch.empty(4), torch.empty(4), torch.empty(4, dtype=torch.float16),
              torch.empty(4)]
    assert [len(b) for b in split_by_size(params, MIB, MIB)] == [2, 1, 1]


def test_layout_takes_the_parameters_backwards_and_a_full_first_bucket_on_cpus() -> None:
    params = [torch.empty(n) for n in (64 * 3162, 3162, 3162 * 3162, 3162, 31620, 10)]
    buckets = layout(params, None)
    assert [[p.numel() for p in bucket] for bucket in buckets] == \
        [[10, 31620, 3162, 3162 * 3162], [3162, 64 * 3162]]
    assert buckets[0][0] is params[-1]
