"""Broadcast in the horovod.torch style: in place or not, with a handle or not, and
differentiable (the gradient reaches root_rank only, as in Horovod).
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
from elasticrun.torch.collectives.reduce_ops import Average
from elasticrun.torch.collectives.requests import Kind, Request
from elasticrun.torch.collectives.wire import to_wire
from elasticrun.torch.world import plane
from elasticrun.torch.world.boundary import collective
from elasticrun.torch.world.place import Scope, world


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet | None = global_process_set) -> int:
    """Starts overwriting `tensor` with root_rank's; returns a handle."""
    return handles.register(_start(tensor, root_rank, name, process_set, deferrable=True))


def _start(tensor: torch.Tensor, root_rank: int, name: str | None,
           process_set: ProcessSet | None, deferrable: bool) -> handles.Pending:
    within = scope(process_set, "broadcast")
    members = process_set.ranks if within.group is not None and process_set else None
    problem: BaseException | None = None
    if not isinstance(root_rank, int) or not 0 <= root_rank < world()[1] or (
            members is not None and root_rank not in members):
        problem = ValueError(f"root_rank={root_rank!r}: expected a rank of "
                             f"{members if members is not None else 'the job'}")
    problem = problem or handles.name_problem(name)
    request = Request(Kind.BROADCAST, dtypes=(tensor.dtype,), shapes=(tuple(tensor.shape),),
                      device="GPU" if tensor.is_cuda else "CPU",
                      root=root_rank if problem is None else -1, name=name,
                      error=str(problem) if problem else "")
    return handles.submit(request, problem, within,
                          lambda: _launch(tensor, root_rank, name, within), deferrable)


def _launch(tensor: torch.Tensor, root_rank: int, name: str | None,
            within: Scope) -> handles.Pending:
    what = f"broadcast {name or ''}".strip()
    if within.size == 1:
        return handles.Pending(what, [], lambda: tensor, name=name)
    target = to_wire(tensor.contiguous())
    with collective("broadcast", nbytes=nbytes(target)):
        work = plane.broadcast(target, src=root_rank, async_op=True, group=within.group)

    def finish() -> torch.Tensor:
        if target.data_ptr() != tensor.data_ptr():
            tensor.copy_(target)
        return tensor

    return handles.Pending(what, [work], finish, nbytes=nbytes(target), name=name)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet | None = global_process_set) -> int:
    """Starts broadcasting root_rank's `tensor` into a copy (`tensor` is left
    unchanged); returns a handle whose synchronize() returns the copy."""
    return broadcast_async_(tensor.detach().clone(), root_rank, name, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet | None = global_process_set) -> torch.Tensor:
    """Overwrites `tensor` with root_rank's, in place, and returns it."""
    return handles.synchronize(handles.register(
        _start(tensor, root_rank, name, process_set, deferrable=False)))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None,
                process_set: ProcessSet | None) -> torch.Tensor:
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return broadcast_(tensor.detach().clone(), root_rank, name, process_set)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        reduced = allreduce(grad, op=Average, process_set=ctx.process_set)
        if world()[0] != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet | None = global_process_set) -> torch.Tensor:
    """A new tensor holding root_rank's `tensor` (differentiable, as in Horovod)."""
    check(process_set, "broadcast")
    return _Broadcast.apply(tensor, root_rank, name, process_set)
