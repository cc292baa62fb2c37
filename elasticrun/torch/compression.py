"""Gradient compression for allreduce, with horovod.torch's interface.

A compressor turns a tensor into the tensor that travels (`compress` returns it with the
context `decompress` needs) and back. `Compression.fp16` sends floating tensors as float16
(Gloo reduces float16 on CPU) and returns them in their own dtype; other tensors travel as
they are.
"""

from __future__ import annotations

from typing import Any

import torch


class Compressor:
    """Interface for compressing and decompressing a given tensor."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Compresses a tensor and returns it with the context needed to decompress it."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Decompresses the tensor with the given context."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Default no-op compression."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        compressed = tensor
        if tensor.dtype.is_floating_point:
            compressed = tensor.type(torch.float16)
        return compressed, tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        dtype: torch.dtype = ctx
        if dtype.is_floating_point:
            return tensor.type(dtype)
        return tensor


class Compression:
    """Optional gradient compression algorithm used during allreduce."""

    none = NoneCompressor
    """Do not compress the gradients. This is the default."""

    fp16 = FP16Compressor
    """Compress all floating point gradients to 16-bit."""
