"""Adasum: adaptive summation of gradients (Maleki et al., "Scaling Distributed Training
with Adaptive Summation", MLSys 2021), computed as Horovod computes it.

Two gradients combine as

    combine(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

so orthogonal gradients add and equal gradients average. Dot products and squared norms
accumulate in float64 and the scaled sum is formed in float64 before it is rounded back to
the tensor's dtype (Horovod's adasum.h); a squared norm below sqrt(DBL_MIN) leaves its
coefficient at 1. When many tensors are reduced together, every tensor (layer) gets its own
coefficients, even where the tensors travel fused in one buffer.

Ranks combine pairwise, recursively: at level d = 1, 2, 4, ... the group of ranks
[r, r+d) combines with the group [r+d, r+2d), the lower group's partial being `a`. Any
number of ranks works: a group without a partner at some level carries its partial up
unchanged (3 ranks: combine(combine(x0, x1), x2)). Rank 0 ends with the result and
broadcasts it, so every rank holds the same bits.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

import torch

from elasticrun.torch.collectives.fusion import DEFAULT_BUCKET_BYTES, buckets
from elasticrun.torch.world import plane, runtime
from elasticrun.torch.world.boundary import collective

# Horovod's guard: a (near-)zero gradient keeps its coefficient at 1.
_MIN_NORM_SQ = math.sqrt(sys.float_info.min)


def _check_floating(tensors: Sequence[torch.Tensor]) -> None:
    for index, tensor in enumerate(tensors):
        if not tensor.is_floating_point():
            raise ValueError(f"Adasum is defined for floating-point tensors only; tensor "
                             f"{index} is {tensor.dtype}")


def _coefficient(dot: float, norm_sq: float) -> float:
    return 1.0 - dot / norm_sq * 0.5 if norm_sq >= _MIN_NORM_SQ else 1.0


def combine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The Adasum of two gradients of one tensor, as a new tensor of a's dtype and shape."""
    _check_floating([a, b])
    if a.shape != b.shape:
        raise ValueError(f"Adasum combines tensors of one shape, not {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    a64 = a.detach().reshape(-1).to(torch.float64)
    b64 = b.detach().reshape(-1).to(torch.float64)
    dot = torch.dot(a64, b64).item()
    a_coeff = _coefficient(dot, torch.dot(a64, a64).item())
    b_coeff = _coefficient(dot, torch.dot(b64, b64).item())
    return (a_coeff * a64 + b_coeff * b64).to(a.dtype).reshape(a.shape)


def adasum_reference(per_rank: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """The Adasum of every rank's tensors (`per_rank[rank][i]`), in one process: tensor by
    tensor, over the recursive halves of the rank list (split at the largest power of two
    below its length), each pair by `combine`. The definition the collective must meet."""
    if not per_rank:
        raise ValueError("adasum_reference needs the tensors of at least one rank")

    def tree(values: list[torch.Tensor]) -> torch.Tensor:
        if len(values) == 1:
            return values[0].clone()
        half = 1 << ((len(values) - 1).bit_length() - 1)
        return combine(tree(values[:half]), tree(values[half:]))

    return [tree([tensors[i] for tensors in per_rank]) for i in range(len(per_rank[0]))]


# Above this many tensors in one buffer, per-tensor Python calls cost more than a few
# vectorised passes over the whole buffer.
_VECTORISED_FROM = 4096


def _combine_fused(a: torch.Tensor, b: torch.Tensor, counts: list[int]) -> None:
    """a <- combine(a, b) for each of the consecutive segments of `counts` elements in the
    flat buffers a and b, each segment with its own coefficients."""
    a64 = a.to(torch.float64)
    b64 = b.to(torch.float64)
    if len(counts) < _VECTORISED_FROM:
        for a_part, b_part in zip(a64.split(counts), b64.split(counts), strict=True):
            dot = torch.dot(a_part, b_part).item()
            a_part.mul_(_coefficient(dot, torch.dot(a_part, a_part).item()))
            b_part.mul_(_coefficient(dot, torch.dot(b_part, b_part).item()))
    else:
        lengths = torch.tensor(counts, device=a.device)
        dots, a_norms, b_norms = (
            torch.segment_reduce(product, "sum", lengths=lengths).tolist()
            for product in (a64 * b64, a64 * a64, b64 * b64))
        for part, norms in ((a64, a_norms), (b64, b_norms)):
            coeffs = [_coefficient(dot, norm) for dot, norm in zip(dots, norms, strict=True)]
            part.mul_(torch.tensor(coeffs, dtype=torch.float64, device=a.device)
                      .repeat_interleave(lengths))
    a.copy_(a64.add_(b64))


def _reduce_flat(flat: torch.Tensor, counts: list[int], rank: int, size: int) -> None:
    """Adasum of `flat` over all ranks, in place; every rank ends with rank 0's result."""
    received = torch.empty_like(flat)
    level = 1
    while level < size:
        if rank % (2 * level) == level:
            # This rank leads an upper group: it hands its partial down and is done.
            with collective("adasum allreduce"):
                plane.send(flat, dst=rank - level)
            break
        if rank % (2 * level) == 0 and rank + level < size:
            with collective("adasum allreduce"):
                plane.recv(received, src=rank + level)
            _combine_fused(flat, received, counts)
        level *= 2
    with collective("adasum allreduce"):
        plane.broadcast(flat, src=0)


def adasum_allreduce_(tensors: list[torch.Tensor],
                      bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
    """Replaces every tensor, on every rank, by the Adasum of its values on all ranks.

    The tensors travel fused in flat buffers of one dtype (at most ~bucket_bytes each, as
    for other fused collectives) but each tensor gets its own Adasum coefficients. Every
    rank must pass tensors of the same shapes and dtypes in the same order. Raises
    ValueError for a non-floating tensor, WorkersFailedError when communication fails."""
    _check_floating(tensors)
    slot = runtime.current().slot
    if slot.size == 1 or not tensors:
        return
    with torch.no_grad():
        for group in buckets(tensors, bucket_bytes):
            members = [tensors[i] for i in group]
            if len(members) == 1 and members[0].is_contiguous():
                # A large tensor alone in its bucket is reduced in place, without copies.
                _reduce_flat(members[0].detach().view(-1), [members[0].numel()], slot.rank,
                             slot.size)
                continue
            flat = torch.cat([t.detach().reshape(-1) for t in members])
            _reduce_flat(flat, [t.numel() for t in members], slot.rank, slot.size)
            offset = 0
            for tensor in members:
                count = tensor.numel()
                tensor.copy_(flat[offset:offset + count].view_as(tensor))
                offset += count
