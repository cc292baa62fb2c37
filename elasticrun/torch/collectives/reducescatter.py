"""Reducescatter in the horovod.torch style: this rank's share of the reduced first dimension
(the first ranks get one row more when the rows do not divide evenly). Gloo has no
reduce-scatter, so this is an allreduce and a slice.
"""

from __future__ import annotations

from typing import Any

import torch

from elasticrun.torch.collectives import handles
from elasticrun.torch.collectives.allgather import allgather
from elasticrun.torch.collectives.fusion import nbytes
from elasticrun.torch.collectives.process_sets import (
    ProcessSet,
    check,
    global_process_set,
    scope,
)
from elasticrun.torch.collectives.reduce_ops import (
    TORCH_OPS,
    Average,
    ReduceOp,
    Sum,
    resolve_op,
    scale_,
)
from elasticrun.torch.collectives.requests import CollectiveMismatchError, Kind, Request
from elasticrun.torch.collectives.wire import to_wire
from elasticrun.torch.compression import Compression, Compressor
from elasticrun.torch.world import plane
from elasticrun.torch.world.boundary import collective
from elasticrun.torch.world.place import Scope

# Horovod's message (its C++ controller's Status::Aborted) for Adasum, Min, Max and Product.
ONLY_AVERAGE_AND_SUM = "Reducescatter currently only supports AVERAGE and SUM."


def _share(rows: int, size: int, rank: int) -> tuple[int, int]:
    """(offset, count) of this rank's rows: the first `rows % size` ranks get one more."""
    base, extra = divmod(rows, size)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: ReduceOp = Average,
                        process_set: ProcessSet | None = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Starts reducing `tensor` over all ranks; this rank's result is its share of the
    first dimension. Gloo has no reduce-scatter, so this is an allreduce and a slice."""
    return handles.register(_start(tensor, name, op, process_set, prescale_factor,
                                   postscale_factor, deferrable=True))


def _start(tensor: torch.Tensor, name: str | None, op: ReduceOp,
           process_set: ProcessSet | None, prescale_factor: float, postscale_factor: float,
           deferrable: bool) -> handles.Pending:
    within = scope(process_set, "reducescatter")
    op = resolve_op(op, None)
    problem: BaseException | None = None
    if op not in (Average, Sum):  # Horovod's words; a program error, not a failed peer
        problem = CollectiveMismatchError(ONLY_AVERAGE_AND_SUM)
    elif tensor.dim() == 0:
        problem = ValueError("reducescatter needs a tensor with at least one dimension")
    problem = problem or handles.name_problem(name)
    request = Request(Kind.REDUCESCATTER, dtypes=(tensor.dtype,),
                      shapes=(tuple(tensor.shape),), device="GPU" if tensor.is_cuda else "CPU",
                      op=op.value, scales=(prescale_factor, postscale_factor), name=name,
                      error=str(problem) if problem else "")
    return handles.submit(request, problem, within,
                          lambda: _launch(tensor, name, op, within, prescale_factor,
                                          postscale_factor), deferrable)


def _launch(tensor: torch.Tensor, name: str | None, op: ReduceOp, within: Scope,
            prescale_factor: float, postscale_factor: float) -> handles.Pending:
    rank, size = within.rank, within.size
    reduced = to_wire(tensor.detach(), reducing=True).clone()
    scale_(reduced, prescale_factor)
    works = []
    if size > 1:
        with collective("reducescatter", nbytes=nbytes(reduced), op=op.value):
            works.append(plane.all_reduce(reduced, op=TORCH_OPS[op], async_op=True,
                                          group=within.group))
    offset, count = _share(tensor.shape[0], size, rank)
    after = postscale_factor / size if op is Average else postscale_factor

    def finish() -> torch.Tensor:
        mine = reduced.narrow(0, offset, count).clone()
        scale_(mine, after)
        return mine.to(tensor.dtype)

    return handles.Pending(f"reducescatter {name or ''}".strip(), works, finish,
                           nbytes=nbytes(reduced), op=op.value, name=name)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: ReduceOp,
                prescale: float, postscale: float, process_set: ProcessSet | None
                ) -> torch.Tensor:
        ctx.settings = (op, prescale, postscale, process_set)
        return handles.synchronize(handles.register(
            _start(tensor, name, op, process_set, prescale, postscale, deferrable=False)))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        op, prescale, postscale, process_set = ctx.settings
        size = scope(process_set, "reducescatter").size
        grad = grad * (size if op is Sum else 1) * prescale * postscale
        return allgather(grad, process_set=process_set), None, None, None, None, None


def reducescatter(tensor: torch.Tensor, name: str | None = None,
                  compression: type[Compressor] = Compression.none, op: ReduceOp = Average,
                  process_set: ProcessSet | None = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduces `tensor` across all ranks (op Average or Sum) and returns this rank's
    share of the result: a slice of its first dimension, the first ranks getting one row
    more when it does not divide evenly. Differentiable; `compression` compresses the tensor
    for the reduction."""
    check(process_set, "reducescatter")
    compressed, context = compression.compress(tensor)
    reduced = _Reducescatter.apply(compressed, name, op, prescale_factor, postscale_factor,
                                   process_set)
    return compression.decompress(reduced, context)


def grouped_reducescatter(tensors: list[torch.Tensor], name: str | None = None,
                          compression: type[Compressor] = Compression.none,
                          op: ReduceOp = Average,
                          process_set: ProcessSet | None = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0
                          ) -> list[torch.Tensor]:
    """reducescatter() of each of `tensors`; returns this rank's shares, in order."""
    return [reducescatter(t, name, compression, op, process_set, prescale_factor,
                          postscale_factor) for t in tensors]


def grouped_reducescatter_async(tensors: list[torch.Tensor], name: str | None = None,
                                op: ReduceOp = Average,
                                process_set: ProcessSet | None = global_process_set,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0
                                ) -> int:
    """Starts a reducescatter of each of `tensors`; returns one handle whose
    synchronize() returns this rank's shares, in order."""
    started = [handles.register(_start(t, None if name is None else f"{name}.{index}", op,
                                       process_set, prescale_factor, postscale_factor,
                                       deferrable=True))
               for index, t in enumerate(tensors)]
    return handles.register(handles.Pending(
        "grouped reducescatter", [], lambda: [handles.synchronize(h) for h in started]))
