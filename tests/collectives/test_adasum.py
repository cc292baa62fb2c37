"""Adasum: the pairwise formula by hand, the reference tree, and the collective on 2 to 5
real Gloo ranks against the reference."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from elasticrun.torch.collectives.adasum import (
    _combine_fused,
    adasum_allreduce_,
    adasum_reference,
    combine,
)
from elasticrun.torch.world import runtime
from tests.collectives.conftest import world_of


def _t(*values: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


# --- combine, by hand -------------------------------------------------------------------

def test_orthogonal_gradients_add() -> None:
    assert torch.equal(combine(_t(1, 0), _t(0, 1)), _t(1, 1))
    assert torch.equal(combine(_t(3, 0, 0), _t(0, 0, -2)), _t(3, 0, -2))


def test_equal_gradients_average_to_themselves() -> None:
    assert torch.equal(combine(_t(3, 4), _t(3, 4)), _t(3, 4))
    # parallel, of different lengths: the mean
    assert torch.allclose(combine(_t(2, 2), _t(6, 6)), _t(4, 4), rtol=0, atol=1e-15)


def test_combine_matches_the_formula_by_hand() -> None:
    # a.b = 1, |a|^2 = 1, |b|^2 = 2: a (1 - 1/2) + b (1 - 1/4)
    assert torch.equal(combine(_t(1, 0), _t(1, 1)), _t(1.25, 0.75))
    # a.b = -4, |a|^2 = |b|^2 = 4: both coefficients 1.5
    assert torch.equal(combine(_t(2, 0), _t(-2, 0)), _t(0, 0))
    # a.b = 11, |a|^2 = 5, |b|^2 = 25: a (1 - 11/10) + b (1 - 11/50)
    expected = _t(-0.1 * 1 + 0.78 * 3, -0.1 * 2 + 0.78 * 4)
    assert torch.allclose(combine(_t(1, 2), _t(3, 4)), expected, rtol=0, atol=1e-15)
    # shape and dtype kept; 0-d tensors
    out = combine(torch.tensor([[1.0, 0.0], [0.0, 0.0]]), torch.tensor([[0.0, 1.0], [0.0, 0.0]]))
    assert out.dtype == torch.float32 and out.shape == (2, 2)
    assert torch.equal(out, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    assert combine(torch.tensor(2.0), torch.tensor(4.0)).item() == 3.0


def test_zero_and_tiny_norms_keep_their_coefficient_at_one() -> None:
    b = _t(1, -2)
    assert torch.equal(combine(torch.zeros(2, dtype=torch.float64), b), b)
    assert torch.equal(combine(b, torch.zeros(2, dtype=torch.float64)), b)
    assert torch.equal(combine(torch.zeros(3), torch.zeros(3)), torch.zeros(3))
    # |a|^2 = 1e-160 < sqrt(DBL_MIN): Horovod's guard leaves both coefficients at 1, so
    # two equal tiny gradients add instead of averaging.
    tiny = _t(1e-80)
    assert torch.equal(combine(tiny, tiny), _t(2e-80))


def test_half_precision_computes_in_float64() -> None:
    # |a|^2 = 250000 overflows float16; the dot products are taken in float64.
    a = torch.tensor([300.0, 400.0], dtype=torch.float16)
    out = combine(a, a)
    assert out.dtype == torch.float16 and torch.equal(out, a)
    x = torch.randn(50, dtype=torch.float16)
    y = torch.randn(50, dtype=torch.float16)
    expected = combine(x.double(), y.double()).half()
    assert torch.equal(combine(x, y), expected)
    assert combine(x.bfloat16(), y.bfloat16()).dtype == torch.bfloat16


def test_adasum_refuses_non_floating_tensors() -> None:
    with pytest.raises(ValueError, match="floating-point") as raised:
        combine(torch.ones(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64))
    assert "\n" not in str(raised.value)
    with pytest.raises(ValueError, match="tensor 1 is torch.int32"):
        adasum_allreduce_([torch.ones(2), torch.ones(2, dtype=torch.int32)])
    with pytest.raises(ValueError, match="shape"):
        combine(torch.ones(2), torch.ones(3))


def test_a_world_of_one_leaves_tensors_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = SimpleNamespace(slot=SimpleNamespace(rank=0, size=1))
    monkeypatch.setattr(runtime, "_runtime", fake)
    tensors = [torch.randn(3), torch.randn(2, 2)]
    before = [t.clone() for t in tensors]
    adasum_allreduce_(tensors)
    assert all(torch.equal(t, b) for t, b in zip(tensors, before, strict=True))


# --- the reference tree -----------------------------------------------------------------

def test_reference_tree_for_any_number_of_ranks() -> None:
    x = [[torch.randn(6, dtype=torch.float64)] for _ in range(7)]
    c = combine

    def ref(n: int) -> torch.Tensor:
        return adasum_reference(x[:n])[0]

    assert torch.equal(ref(1), x[0][0])
    assert torch.equal(ref(2), c(x[0][0], x[1][0]))
    assert torch.equal(ref(3), c(c(x[0][0], x[1][0]), x[2][0]))
    c01, c23 = c(x[0][0], x[1][0]), c(x[2][0], x[3][0])
    assert torch.equal(ref(4), c(c01, c23))
    assert torch.equal(ref(5), c(c(c01, c23), x[4][0]))
    assert torch.equal(ref(7), c(c(c01, c23), c(c(x[4][0], x[5][0]), x[6][0])))


# --- the collective on real ranks ------------------------------------------------------

_SHAPES: list[tuple[int, ...]] = [(3, 4), (7,), (), (1,), (2, 3, 5), (0,), (4,), (5, 6)]
_LARGE = 300_000  # 1.2 MB of float32: reduced in place, alone in its bucket


def _case(size: int, rank: int, seed: int) -> list[torch.Tensor]:
    """Rank `rank`'s tensors: mixed shapes, a tensor zero on rank 1 only, one zero on all
    ranks, float64 and float16 members, a transposed (non-contiguous) one, a large one."""
    generator = torch.Generator().manual_seed(seed * 100 + rank)
    tensors = [torch.randn(shape, generator=generator) for shape in _SHAPES]
    if rank == 1:
        tensors[1].zero_()
    tensors[6].zero_()
    tensors.append(torch.randn(4, 3, generator=generator, dtype=torch.float64))
    tensors.append(torch.randn(9, generator=generator).half())
    tensors.append(torch.randn(5, 3, generator=generator).t())
    tensors.append(torch.randn(_LARGE, generator=generator))
    return tensors


def _structured(size: int, rank: int) -> list[torch.Tensor]:
    """Orthogonal vectors (one per rank), equal vectors, and parallel vectors."""
    generator = torch.Generator().manual_seed(7)
    q, _ = torch.linalg.qr(torch.randn(40, size, dtype=torch.float64, generator=generator))
    direction = torch.randn(30, dtype=torch.float64, generator=generator)
    scales = torch.rand(size, dtype=torch.float64, generator=generator) + 0.5
    return [q[:, rank].clone(), direction.clone(), direction * scales[rank]]


def _run_adasum(size: int) -> dict[str, list[torch.Tensor]]:
    rank = runtime.current().slot.rank
    results: dict[str, list[torch.Tensor]] = {}
    for seed, bucket_bytes in ((1, None), (2, 64)):
        tensors = _case(size, rank, seed)
        if bucket_bytes is None:
            adasum_allreduce_(tensors)
        else:
            adasum_allreduce_(tensors, bucket_bytes=bucket_bytes)
        results[f"case{seed}"] = tensors
    structured = _structured(size, rank)
    adasum_allreduce_(structured)
    results["structured"] = structured
    return results


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    return {torch.float16: {"rtol": 2e-3, "atol": 2e-3},
            torch.float32: {"rtol": 1e-6, "atol": 1e-6},
            torch.float64: {"rtol": 1e-12, "atol": 1e-12}}[dtype]


@pytest.mark.parametrize("size", [2, 3, 4, 5])
def test_the_collective_equals_the_reference_on_every_rank(size: int) -> None:
    per_rank = world_of(size).run(_run_adasum, size)
    for name, results in per_rank[0].items():
        for rank in range(1, size):  # every rank holds the same bits
            for mine, theirs in zip(results, per_rank[rank][name], strict=True):
                assert torch.equal(mine, theirs) and mine.dtype == theirs.dtype, (name, rank)

    for seed in (1, 2):
        inputs = [_case(size, rank, seed) for rank in range(size)]
        expected = adasum_reference(inputs)
        got = per_rank[0][f"case{seed}"]
        for index, (out, want) in enumerate(zip(got, expected, strict=True)):
            assert out.shape == want.shape and out.dtype == want.dtype, index
            assert torch.allclose(out, want, **_tolerance(out.dtype)), (seed, index)
        assert torch.equal(got[6], torch.zeros(4))  # zero on every rank stays zero

    orthogonal, equal, parallel = per_rank[0]["structured"]
    inputs = [_structured(size, rank) for rank in range(size)]
    assert torch.allclose(orthogonal, sum(x[0] for x in inputs), rtol=0, atol=1e-12)
    assert torch.allclose(equal, inputs[0][1], rtol=0, atol=1e-12)
    if size & (size - 1) == 0:  # a balanced tree: parallel gradients average
        mean = sum(x[2] for x in inputs) / size
        assert torch.allclose(parallel, mean, rtol=0, atol=1e-12)
    assert torch.allclose(parallel, adasum_reference(inputs)[2], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("tensors", [3, 5000])
def test_fused_buffers_combine_tensor_by_tensor(tensors: int) -> None:
    generator = torch.Generator().manual_seed(tensors)
    counts = torch.randint(0, 6, (tensors,), generator=generator).tolist()
    a_parts = [torch.randn(n, generator=generator) for n in counts]
    b_parts = [torch.randn(n, generator=generator) for n in counts]
    a_parts[1].zero_()
    b_parts[2].zero_()
    fused = torch.cat(a_parts)
    _combine_fused(fused, torch.cat(b_parts), counts)
    expected = torch.cat([combine(a, b) for a, b in zip(a_parts, b_parts, strict=True)])
    assert torch.allclose(fused, expected, rtol=1e-6, atol=1e-7)
