"""Collectives in the horovod.torch style, over the current round's Gloo process group.

Each raises WorkersFailedError when it fails to communicate (a peer died, hung, or the
round broke); misuse (ValueError, TypeError) passes unchanged."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from elasticrun.torch import runtime
from elasticrun.torch.boundary import collective
from elasticrun.torch.fusion import fused_collective


class ReduceOp(enum.Enum):
    AVERAGE = "average"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    PRODUCT = "product"


Average, Sum, Min, Max, Product = (ReduceOp.AVERAGE, ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX,
                                   ReduceOp.PRODUCT)
_TORCH_OPS = {
    ReduceOp.AVERAGE: dist.ReduceOp.SUM, ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MIN: dist.ReduceOp.MIN, ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}


def rank() -> int:
    return runtime.current().slot.rank


def size() -> int:
    return runtime.current().slot.size


def local_rank() -> int:
    return runtime.current().slot.local_rank


def local_size() -> int:
    return runtime.current().slot.local_size


def cross_rank() -> int:
    return runtime.current().slot.cross_rank


def cross_size() -> int:
    return runtime.current().slot.cross_size


def _divide(tensor: torch.Tensor, divisor: int) -> None:
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.div_(divisor)
    else:
        tensor.floor_divide_(divisor)


def allreduce_(tensor: torch.Tensor, op: ReduceOp = Average) -> torch.Tensor:
    """Reduces `tensor` across all ranks in place and returns it."""
    with collective("allreduce"):
        dist.all_reduce(tensor, op=_TORCH_OPS[op])
    if op is ReduceOp.AVERAGE:
        _divide(tensor, size())
    return tensor


def allreduce(tensor: torch.Tensor, op: ReduceOp = Average) -> torch.Tensor:
    """Returns a new tensor: `tensor` reduced across all ranks (average by default)."""
    return allreduce_(tensor.detach().clone(), op)


def grouped_allreduce_(tensors: list[torch.Tensor], op: ReduceOp = Average) -> None:
    """Reduces many tensors in place with a few fused collectives."""
    world = size()

    def launch(flat: torch.Tensor) -> dist.Work | None:
        return dist.all_reduce(flat, op=_TORCH_OPS[op], async_op=True)

    def finish(flat: torch.Tensor) -> None:
        if op is ReduceOp.AVERAGE:
            _divide(flat, world)

    fused_collective(tensors, launch, finish, what="grouped allreduce")


def broadcast_(tensor: torch.Tensor, root_rank: int = 0) -> torch.Tensor:
    with collective("broadcast"):
        dist.broadcast(tensor, src=root_rank)
    return tensor


def broadcast(tensor: torch.Tensor, root_rank: int = 0) -> torch.Tensor:
    return broadcast_(tensor.detach().clone(), root_rank)


def broadcast_object(obj: Any = None, root_rank: int = 0) -> Any:
    """Returns root_rank's `obj` on every rank (pickled; use for small objects)."""
    holder = [obj]
    with collective("broadcast_object"):
        dist.broadcast_object_list(holder, src=root_rank)
    return holder[0]


def allgather_object(obj: Any) -> list[Any]:
    """Returns every rank's `obj`, indexed by rank."""
    gathered: list[Any] = [None] * size()
    with collective("allgather_object"):
        dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_parameters(
    params: Mapping[str, torch.Tensor]
    | Iterable[tuple[str, torch.Tensor]]
    | Iterable[torch.Tensor],
    root_rank: int = 0,
) -> None:
    """Overwrites the given tensors in place with root_rank's values (fused).

    Accepts `model.state_dict()`, `model.named_parameters()` or a list of tensors.
    """
    items = params.values() if isinstance(params, Mapping) else params
    tensors = [item[1] if isinstance(item, tuple) else item for item in items]
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    if tensors:
        fused_collective(tensors, lambda flat: dist.broadcast(flat, src=root_rank, async_op=True),
                         what="broadcast_parameters")


@dataclass(frozen=True)
class _TensorLeaf:
    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype


def broadcast_tree(tree: Any, root_rank: int = 0) -> Any:
    """Returns root_rank's nested dict/list/tuple structure on every rank. The structure
    travels pickled; its tensors travel as fused broadcasts, not through pickle."""
    tensors: list[torch.Tensor] = []

    def strip(node: Any) -> Any:
        if isinstance(node, torch.Tensor):
            tensors.append(node.detach())
            return _TensorLeaf(len(tensors) - 1, tuple(node.shape), node.dtype)
        if isinstance(node, dict):
            return {key: strip(value) for key, value in node.items()}
        if isinstance(node, (list, tuple)):
            stripped = [strip(value) for value in node]
            return stripped if isinstance(node, list) else tuple(stripped)
        return node

    is_root = rank() == root_rank
    skeleton = broadcast_object(strip(tree) if is_root else None, root_rank)
    leaves: list[_TensorLeaf] = []

    def collect(node: Any) -> None:
        if isinstance(node, _TensorLeaf):
            leaves.append(node)
        elif isinstance(node, dict):
            for value in node.values():
                collect(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                collect(value)

    collect(skeleton)
    if not is_root:
        tensors = [torch.empty(leaf.shape, dtype=leaf.dtype) for leaf in leaves]
    else:
        tensors = [t.contiguous() for t in tensors]
    if tensors:
        fused_collective(tensors, lambda flat: dist.broadcast(flat, src=root_rank, async_op=True),
                         what="broadcast_tree")

    def rebuild(node: Any) -> Any:
        if isinstance(node, _TensorLeaf):
            return tensors[node.index]
        if isinstance(node, dict):
            return {key: rebuild(value) for key, value in node.items()}
        if isinstance(node, (list, tuple)):
            rebuilt = [rebuild(value) for value in node]
            return rebuilt if isinstance(node, list) else tuple(rebuilt)
        return node

    return rebuild(skeleton)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None:
    """Makes every rank's optimizer state (and hyper-parameters) equal root_rank's."""
    state = broadcast_tree(optimizer.state_dict(), root_rank)
    if rank() != root_rank:
        optimizer.load_state_dict(state)
