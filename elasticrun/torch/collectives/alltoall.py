"""Alltoall in the horovod.torch style: `splits[r]` rows to rank r (or equal parts); the
result also says how many rows came from each rank when splits are given.
"""

from __future__ import annotations

from typing import Any

import torch

from elasticrun.torch.collectives import handles
from elasticrun.torch.collectives.fusion import nbytes
from elasticrun.torch.collectives.process_sets import (
    ProcessSet,
    check,
    global_process_set,
    scope,
)
from elasticrun.torch.collectives.requests import Kind, Request
from elasticrun.torch.collectives.wire import to_wire
from elasticrun.torch.world import plane
from elasticrun.torch.world.boundary import collective
from elasticrun.torch.world.place import Scope


def _splits_of(tensor: torch.Tensor, splits: torch.Tensor | list[int] | None, size: int
               ) -> list[int]:
    rows = tensor.shape[0]
    if splits is None:
        if rows % size:
            raise ValueError(f"alltoall without splits needs a first dimension divisible by "
                             f"the {size} ranks, got {rows}")
        return [rows // size] * size
    counts = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    if len(counts) != size or any(c < 0 for c in counts) or sum(counts) != rows:
        raise ValueError(f"alltoall splits {counts}: expected {size} non-negative counts "
                         f"summing to the first dimension, {rows}")
    return counts


def alltoall_async(tensor: torch.Tensor, splits: torch.Tensor | list[int] | None = None,
                   name: str | None = None,
                   process_set: ProcessSet | None = global_process_set) -> int:
    """Starts sending `splits[r]` rows of `tensor` to each rank r; returns a handle whose
    result is (output, received_splits)."""
    return handles.register(_start(tensor, splits, name, process_set, deferrable=True))


def _start(tensor: torch.Tensor, splits: torch.Tensor | list[int] | None, name: str | None,
           process_set: ProcessSet | None, deferrable: bool) -> handles.Pending:
    within = scope(process_set, "alltoall")
    size = within.size
    counts: list[int] = []
    problem: BaseException | None = None
    try:
        if tensor.dim() == 0:
            raise ValueError("alltoall needs a tensor with at least one dimension")
        counts = _splits_of(tensor, splits, size)
    except ValueError as exc:
        problem = exc
    problem = problem or handles.name_problem(name)
    request = Request(Kind.ALLTOALL, dtypes=(tensor.dtype,), shapes=(tuple(tensor.shape),),
                      device="GPU" if tensor.is_cuda else "CPU", name=name,
                      error=str(problem) if problem else "")
    return handles.submit(request, problem, within,
                          lambda: _launch(tensor, counts, name, within), deferrable)


def _launch(tensor: torch.Tensor, counts: list[int], name: str | None,
            within: Scope) -> handles.Pending:
    size = within.size
    what = f"alltoall {name or ''}".strip()
    if size == 1:
        result = (tensor.detach().clone(), torch.tensor(counts, dtype=torch.int32))
        return handles.Pending(what, [], lambda: result, name=name)
    sent = torch.tensor(counts, dtype=torch.int64)
    received = torch.empty(size, dtype=torch.int64)
    with collective("alltoall: exchanging splits"):
        plane.all_to_all_single(received, sent, group=within.group)
    incoming = [int(c) for c in received.tolist()]
    source = to_wire(tensor.detach().contiguous())
    output = torch.empty((sum(incoming), *source.shape[1:]), dtype=source.dtype,
                         device=source.device)
    with collective("alltoall", nbytes=nbytes(source)):
        work = plane.all_to_all_single(output, source, output_split_sizes=incoming,
                                      input_split_sizes=counts, async_op=True,
                                      group=within.group)
    received_splits = received.to(torch.int32)
    return handles.Pending(what, [work], lambda: (output.to(tensor.dtype), received_splits),
                           nbytes=nbytes(source), name=name)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: str | None,
                process_set: ProcessSet | None) -> tuple[torch.Tensor, torch.Tensor]:
        output, received = handles.synchronize(handles.register(
            _start(tensor, splits, name, process_set, deferrable=False)))
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: Any) -> tuple[Any, ...]:
        output, _ = handles.synchronize(handles.register(
            _start(grad, ctx.received, None, ctx.process_set, deferrable=False)))
        return output, None, None, None


def alltoall(tensor: torch.Tensor, splits: torch.Tensor | list[int] | None = None,
             name: str | None = None, process_set: ProcessSet | None = global_process_set
             ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Rows of `tensor` scattered to the ranks (`splits[r]` rows to rank r, or equal parts)
    and the rows they sent here, gathered in rank order. With `splits`, also returns how many
    rows came from each rank."""
    check(process_set, "alltoall")
    output, received = _Alltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)
