"""Allgather in the horovod.torch style: tensors whose first dimension differs per rank are
gathered by first exchanging the sizes; differentiable. Also sparse allreduce, which is an
allgather of every rank's indices and values, as in Horovod.
"""

from __future__ import annotations

from typing import Any

import torch

from elasticrun.torch.collectives import handles
from elasticrun.torch.collectives.allreduce import allreduce
from elasticrun.torch.collectives.fusion import nbytes
from elasticrun.torch.collectives.process_sets import (
    ProcessSet,
    check,
    global_process_set,
    scope,
)
from elasticrun.torch.collectives.reduce_ops import Average, ReduceOp, Sum, resolve_op
from elasticrun.torch.collectives.requests import Kind, Request
from elasticrun.torch.collectives.wire import to_wire
from elasticrun.torch.world import plane
from elasticrun.torch.world.boundary import collective
from elasticrun.torch.world.place import Scope


def _first_dims(tensor: torch.Tensor, within: Scope) -> list[int]:
    """Every rank's first dimension (once the ranks agreed on the rest)."""
    mine = torch.tensor([tensor.shape[0]], dtype=torch.int64)
    everyone = [torch.zeros(1, dtype=torch.int64) for _ in range(within.size)]
    with collective("allgather: exchanging sizes"):
        plane.all_gather(everyone, mine, group=within.group)
    return [int(t.item()) for t in everyone]


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet | None = global_process_set) -> int:
    """Starts concatenating every rank's `tensor` along the first dimension (which may
    differ per rank); returns a handle."""
    return handles.register(_start(tensor, name, process_set, deferrable=True))


def _start(tensor: torch.Tensor, name: str | None, process_set: ProcessSet | None,
           deferrable: bool) -> handles.Pending:
    within = scope(process_set, "allgather")
    problem: BaseException | None = None
    if tensor.dim() == 0:
        problem = ValueError("allgather needs a tensor with at least one dimension (Horovod: "
                             "tried to ALLGATHER a rank-zero tensor)")
    problem = problem or handles.name_problem(name)
    request = Request(Kind.ALLGATHER, dtypes=(tensor.dtype,), shapes=(tuple(tensor.shape),),
                      device="GPU" if tensor.is_cuda else "CPU", name=name,
                      error=str(problem) if problem else "")
    return handles.submit(request, problem, within, lambda: _launch(tensor, name, within),
                          deferrable)


def _launch(tensor: torch.Tensor, name: str | None, within: Scope) -> handles.Pending:
    size = within.size
    what = f"allgather {name or ''}".strip()
    if size == 1:
        result = tensor.detach().clone()
        return handles.Pending(what, [], lambda: result, name=name)
    dims = _first_dims(tensor, within)
    longest = max(dims)
    rest = tuple(tensor.shape[1:])
    source = to_wire(tensor.detach())
    padded = torch.zeros((longest, *rest), dtype=source.dtype, device=tensor.device)
    padded[:tensor.shape[0]] = source
    parts = [torch.empty_like(padded) for _ in range(size)]
    with collective("allgather", nbytes=nbytes(padded)):
        work = plane.all_gather(parts, padded, async_op=True, group=within.group)

    def finish() -> torch.Tensor:
        gathered = torch.cat([part[:dim] for part, dim in zip(parts, dims, strict=True)])
        return gathered.to(tensor.dtype)

    return handles.Pending(what, [work], finish, nbytes=nbytes(padded) * size, name=name)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None,
                process_set: ProcessSet | None) -> torch.Tensor:
        ctx.dim, ctx.process_set = tensor.shape[0], process_set
        return handles.synchronize(handles.register(
            _start(tensor, name, process_set, deferrable=False)))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        reduced = allreduce(grad, op=Average, process_set=ctx.process_set)
        rank = scope(ctx.process_set, "allgather").rank
        dims = handles.synchronize(handles.register(
            _start(torch.tensor([ctx.dim]), None, ctx.process_set, deferrable=False)))
        offset = int(dims[:rank].sum())
        return reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet | None = global_process_set) -> torch.Tensor:
    """Every rank's `tensor`, concatenated along the first dimension in rank order."""
    check(process_set, "allgather")
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather(tensors: list[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet | None = global_process_set) -> list[torch.Tensor]:
    """allgather() of each of `tensors`; returns the gathered tensors, in order."""
    return [allgather(t, name, process_set) for t in tensors]


def grouped_allgather_async(tensors: list[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet | None = global_process_set) -> int:
    """Starts an allgather of each of `tensors`; returns one handle whose
    synchronize() returns the gathered tensors, in order."""
    started = [handles.register(_start(t, None if name is None else f"{name}.{index}",
                                       process_set, deferrable=True))
               for index, t in enumerate(tensors)]
    return handles.register(handles.Pending(
        "grouped allgather", [], lambda: [handles.synchronize(h) for h in started]))


class SparseHandle(int):
    """The handle of a sparse allreduce: `synchronize(handle)` or, as Horovod's is a
    function, `handle()`, returns the reduced sparse tensor."""

    def __call__(self) -> torch.Tensor:
        result: torch.Tensor = handles.synchronize(self)
        return result


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None = None,
                           op: ReduceOp = Average,
                           process_set: ProcessSet | None = global_process_set) -> SparseHandle:
    """A sparse tensor reduced by gathering every rank's indices and values (as Horovod)."""
    check(process_set, "sparse_allreduce_async")
    op = resolve_op(op, None)
    if op not in (Average, Sum):
        raise ValueError(f"sparse allreduce supports Average and Sum, not {op.name}")
    sparse = tensor.coalesce()
    indices = handles.synchronize(handles.register(_start(
        sparse.indices().t().contiguous(), None if name is None else f"{name}.indices",
        process_set, deferrable=False)))
    values = handles.synchronize(handles.register(_start(
        sparse.values(), None if name is None else f"{name}.values", process_set,
        deferrable=False)))
    if op is Average:
        values = values / scope(process_set, "sparse_allreduce_async").size
    result = torch.sparse_coo_tensor(indices.t(), values, sparse.shape).coalesce()
    return SparseHandle(handles.register(handles.Pending("sparse allreduce", [],
                                                         lambda: result)))
