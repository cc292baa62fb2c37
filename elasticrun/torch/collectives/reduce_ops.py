"""Horovod's reduce ops (Average, Sum, Adasum, Min, Max, Product), what each is on the wire,
Horovod's rule for its deprecated `average` argument, and its scaling of tensors."""

from __future__ import annotations

import enum
import warnings

import torch
import torch.distributed as dist


class ReduceOp(enum.Enum):
    """How the allreduce family combines the ranks' tensors; use the module's names
    Average, Sum, Adasum, Min, Max and Product for its members."""

    AVERAGE = "average"
    SUM = "sum"
    ADASUM = "adasum"
    MIN = "min"
    MAX = "max"
    PRODUCT = "product"


Average, Sum, Adasum, Min, Max, Product = (ReduceOp.AVERAGE, ReduceOp.SUM, ReduceOp.ADASUM,
                                           ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT)
TORCH_OPS = {
    ReduceOp.AVERAGE: dist.ReduceOp.SUM, ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MIN: dist.ReduceOp.MIN, ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}


def resolve_op(op: ReduceOp | None, average: bool | None) -> ReduceOp:
    """Horovod's rule for the deprecated `average` argument: `op` wins, both is an error."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one "
                             "of them.")
        if not isinstance(op, ReduceOp):
            raise ValueError(f"op={op!r}: expected one of Average, Sum, Adasum, Min, Max, "
                             "Product")
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in "
                      "v1.0", DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    return Average


def scale_(tensor: torch.Tensor, factor: float) -> None:
    """Multiplies in place; integers are scaled in double and truncated, as Horovod does."""
    if factor == 1.0:
        return
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.mul_(factor)
    else:
        tensor.copy_((tensor.double() * factor).to(tensor.dtype))


def divide_(tensor: torch.Tensor, divisor: int) -> None:
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.div_(divisor)
    else:
        tensor.floor_divide_(divisor)
