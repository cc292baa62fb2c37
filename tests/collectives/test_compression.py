"""Compression: horovod.torch's compressors, and float16 through a real Gloo allreduce."""

from __future__ import annotations

import torch
import torch.distributed as dist

from elasticrun.torch.compression import (
    Compression,
    Compressor,
    FP16Compressor,
    NoneCompressor,
)
from elasticrun.torch.world import runtime
from elasticrun.torch.world.boundary import collective
from tests.collectives.conftest import world_of


def test_compressors_round_trip() -> None:
    assert Compression.none is NoneCompressor and Compression.fp16 is FP16Compressor
    assert issubclass(FP16Compressor, Compressor) and issubclass(NoneCompressor, Compressor)
    x = torch.randn(5, dtype=torch.float64)
    same, ctx = Compression.none.compress(x)
    assert same is x and Compression.none.decompress(same, ctx) is x
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        tensor = torch.randn(4, 3).to(dtype)
        sent, ctx = Compression.fp16.compress(tensor)
        assert sent.dtype == torch.float16 and ctx == dtype
        back = Compression.fp16.decompress(sent, ctx)
        assert back.dtype == dtype and back.shape == tensor.shape
        assert torch.allclose(back.double(), tensor.double(), rtol=1e-2, atol=1e-3)
    ints = torch.arange(6)
    sent, ctx = Compression.fp16.compress(ints)
    assert sent is ints and Compression.fp16.decompress(sent, ctx) is ints


def _allreduce_compressed(values: list[float]) -> torch.Tensor:
    rank = runtime.current().slot.rank
    tensor = torch.tensor(values, dtype=torch.float32) * (rank + 1)
    sent, ctx = Compression.fp16.compress(tensor)
    with collective("allreduce"):
        dist.all_reduce(sent)
    return Compression.fp16.decompress(sent, ctx)


def test_float16_travels_through_a_gloo_allreduce() -> None:
    values = [0.1, -2.5, 1000.0, 3e-3]
    results = world_of(2).run(_allreduce_compressed, values)
    expected = torch.tensor(values, dtype=torch.float16).float() * 3
    for result in results:
        assert result.dtype == torch.float32
        assert torch.allclose(result, expected, rtol=2e-3)
    assert torch.equal(results[0], results[1])
