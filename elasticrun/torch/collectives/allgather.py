"""Allgather in the horovod.torch style: tensors whose first dimension differs per rank are
gathered by first exchanging the sizes; differentiable. Also sparse allreduce, which is an
allgather of every rank's indices and values, as in Horovod.
"""

from __future__ import annotations

from typing import Any

import torch

from elasticrun.torch.collectives import handles, join
from elasticrun.torch.collectives.allreduce import allreduce
from elasticrun.torch.collectives.fusion import nbytes
from elasticrun.torch.collectives.process_sets import ProcessSet, check, global_process_set
from elasticrun.torch.collectives.reduce_ops import Average, ReduceOp, Sum, resolve_op
from elasticrun.torch.world import plane
from elasticrun.torch.world.boundary import collective
from elasticrun.torch.world.place import world


def _first_dims(tensor: torch.Tensor, what: str) -> list[int]:
    """Every rank's first dimension (after the header that says a gather follows)."""
    if tensor.dim() == 0:
        raise ValueError(f"{what} needs a tensor with at least one dimension")
    _, size = world()
    mine = torch.tensor([tensor.shape[0]], dtype=torch.int64)
    everyone = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
    with collective(f"{what}: exchanging sizes"):
        plane.all_gather(everyone, mine)
    return [int(t.item()) for t in everyone]


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet | None = global_process_set) -> int:
    """Starts concatenating every rank's `tensor` along the first dimension (which may
    differ per rank); returns a handle."""
    check(process_set, "allgather")
    _, size = world()
    if size == 1:
        result = tensor.detach().clone()
        return handles.register(handles.Pending("allgather", [], lambda: result))
    join.announced(join.ALLGATHER)
    dims = _first_dims(tensor, "allgather")
    longest = max(dims)
    rest = tuple(tensor.shape[1:])
    padded = torch.zeros((longest, *rest), dtype=tensor.dtype, device=tensor.device)
    padded[:tensor.shape[0]] = tensor.detach()
    parts = [torch.empty((longest, *rest), dtype=tensor.dtype, device=tensor.device)
             for _ in range(size)]
    with collective("allgather", nbytes=nbytes(padded)):
        work = plane.all_gather(parts, padded, async_op=True)

    def finish() -> torch.Tensor:
        return torch.cat([part[:dim] for part, dim in zip(parts, dims, strict=True)])

    return handles.register(handles.Pending(f"allgather {name or ''}".strip(), [work], finish,
                                            nbytes=nbytes(padded) * size))


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None) -> torch.Tensor:
        ctx.dim = tensor.shape[0]
        return handles.synchronize(allgather_async(tensor, name))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        reduced = allreduce(grad, op=Average)
        rank, _ = world()
        dims = handles.synchronize(allgather_async(torch.tensor([ctx.dim])))
        offset = int(dims[:rank].sum())
        return reduced.narrow(0, offset, ctx.dim), None


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet | None = global_process_set) -> torch.Tensor:
    """Every rank's `tensor`, concatenated along the first dimension in rank order."""
    check(process_set, "allgather")
    return _Allgather.apply(tensor, name)


def grouped_allgather(tensors: list[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet | None = global_process_set) -> list[torch.Tensor]:
    return [allgather(t, name, process_set) for t in tensors]


def grouped_allgather_async(tensors: list[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet | None = global_process_set) -> int:
    started = [allgather_async(t, name, process_set) for t in tensors]
    return handles.register(handles.Pending(
        "grouped allgather", [], lambda: [handles.synchronize(h) for h in started]))


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None = None,
                           op: ReduceOp = Average,
                           process_set: ProcessSet | None = global_process_set) -> int:
    """A sparse tensor reduced by gathering every rank's indices and values (as Horovod)."""
    check(process_set, "sparse_allreduce_async")
    op = resolve_op(op, None)
    if op not in (Average, Sum):
        raise ValueError(f"sparse allreduce supports Average and Sum, not {op.name}")
    sparse = tensor.coalesce()
    indices = handles.synchronize(allgather_async(sparse.indices().t().contiguous()))
    values = handles.synchronize(allgather_async(sparse.values()))
    if op is Average:
        values = values / world()[1]
    result = torch.sparse_coo_tensor(indices.t(), values, sparse.shape).coalesce()
    return handles.register(handles.Pending("sparse allreduce", [], lambda: result))
