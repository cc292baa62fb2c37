"""Tensors as the wire carries them. Neither Gloo nor NCCL has int16: int16 tensors travel as
int32 and come back exact (a sum wraps the same way once cast back). Bool tensors are
reduced as int32 and come back as logical results: Sum and Max are "any", Min and Product
"all" (a value is true when it is not 0). Every other dtype travels as it is."""

from __future__ import annotations

import torch

_WIDER = {torch.int16: torch.int32}


def wire_dtype(dtype: torch.dtype, reducing: bool = False) -> torch.dtype:
    if reducing and dtype == torch.bool:
        return torch.int32
    return _WIDER.get(dtype, dtype)


def to_wire(tensor: torch.Tensor, reducing: bool = False) -> torch.Tensor:
    """`tensor` itself when it travels as it is, else a converted copy."""
    dtype = wire_dtype(tensor.dtype, reducing)
    return tensor if dtype == tensor.dtype else tensor.to(dtype)


def from_wire(wire: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A result off the wire in `dtype` (bool: not 0)."""
    if wire.dtype == dtype:
        return wire
    if dtype == torch.bool:
        return wire != 0
    return wire.to(dtype)
