"""Tensor fusion's bookkeeping: every tensor gets its bucket's result, whether it travelled
in place (alone and contiguous) or through a flat copy. The collective here doubles its
bucket in place, as a collective writes its result into the buffer it was given."""

from __future__ import annotations

import torch

from elasticrun.torch.collectives.fusion import buckets, fused_collective


def doubling(seen: list[torch.Tensor]):  # type: ignore[no-untyped-def]
    def launch(flat: torch.Tensor) -> None:
        seen.append(flat)
        flat.mul_(2)

    return launch


def test_small_tensors_share_a_bucket_and_get_their_results_back() -> None:
    tensors = [torch.arange(3.0), torch.ones(2, 2), torch.full((4,), 5.0)]
    expected = [t * 2 for t in tensors]
    seen: list[torch.Tensor] = []
    fused_collective(tensors, doubling(seen))
    assert len(seen) == 1 and seen[0].numel() == 11
    for got, want in zip(tensors, expected, strict=True):
        assert torch.equal(got, want)


def test_a_tensor_alone_in_its_bucket_is_reduced_in_place_without_a_copy() -> None:
    big, small = torch.arange(1000.0), torch.ones(3)
    storage = big.data_ptr()
    seen: list[torch.Tensor] = []
    fused_collective([big, small], doubling(seen), bucket_bytes=big.numel() * 4)
    assert [t.numel() for t in seen] == [1000, 3]
    assert seen[0].data_ptr() == storage  # the collective ran on the tensor itself
    assert torch.equal(big, torch.arange(1000.0) * 2) and torch.equal(small, torch.full((3,), 2.0))


def test_a_non_contiguous_tensor_alone_goes_through_a_copy() -> None:
    transposed = torch.arange(12.0).reshape(3, 4).t()
    want = transposed * 2
    seen: list[torch.Tensor] = []
    fused_collective([transposed], doubling(seen))
    assert seen[0].data_ptr() != transposed.data_ptr()
    assert torch.equal(transposed, want)


def test_buckets_keep_dtypes_apart_and_respect_the_size() -> None:
    tensors = [torch.ones(10), torch.ones(10, dtype=torch.float64), torch.ones(10)]
    assert buckets(tensors, bucket_bytes=1024) == [[0, 2], [1]]
    assert buckets(tensors, bucket_bytes=40) == [[0], [2], [1]]


def test_a_large_contiguous_tensor_gets_a_bucket_of_its_own() -> None:
    large = torch.ones(256 * 1024)  # 1 MiB: reduced in place rather than copied into a bucket
    small = torch.ones(10)
    assert buckets([small, large, small], bucket_bytes=25 * 1024 * 1024) == [[1], [0, 2]]
    assert buckets([small, large[::2], small], bucket_bytes=25 * 1024 * 1024,
                   alone_bytes=1024) == [[0, 1, 2]]  # not contiguous: fused as before
