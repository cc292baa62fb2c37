"""Allreduce in the horovod.torch style, over the current round's Gloo process group.

Every variant Horovod has: in place or not, one tensor or a group, synchronous or with a
handle for `poll`/`synchronize`, with Horovod's keywords (`op`, the deprecated `average`,
`name`, `compression`, `prescale_factor`, `postscale_factor`, `process_set`). Each raises
WorkersFailedError when it fails to communicate (a peer died, hung, or the round broke);
misuse (ValueError, TypeError) passes unchanged. Adasum is the real adaptive summation
(elasticrun/torch/collectives/adasum.py), not an alias.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from elasticrun.job.errors import NotSupportedError
from elasticrun.torch.collectives import fusion, handles
from elasticrun.torch.collectives.adasum import adasum_allreduce_
from elasticrun.torch.collectives.process_sets import (
    ProcessSet,
    check,
    global_process_set,
    scope,
)
from elasticrun.torch.collectives.reduce_ops import TORCH_OPS, ReduceOp, resolve_op, scale_
from elasticrun.torch.collectives.requests import Kind, Request
from elasticrun.torch.compression import Compression, Compressor
from elasticrun.torch.world import plane
from elasticrun.torch.world.boundary import collective
from elasticrun.torch.world.place import Scope, size


def request_for(tensors: Sequence[torch.Tensor], op: ReduceOp, name: str | None,
                scales: tuple[float, float], problem: BaseException | None
                ) -> tuple[Request, list[tuple[list[int], int, torch.dtype]]]:
    """The negotiated request of an allreduce of `tensors`, and the buckets it launches."""
    planned = [] if op is ReduceOp.ADASUM else fusion.plan(tensors, reducing=True)
    return Request(
        Kind.ADASUM if op is ReduceOp.ADASUM else Kind.ALLREDUCE,
        dtypes=tuple(t.dtype for t in tensors), shapes=tuple(tuple(t.shape) for t in tensors),
        device="GPU" if any(t.is_cuda for t in tensors) else "CPU", op=op.value,
        scales=scales, name=name, buckets=tuple((numel, dtype) for _, numel, dtype in planned),
        error=f"{type(problem).__name__}: {problem}" if problem else ""), planned


def _problem(tensors: Sequence[torch.Tensor], op: ReduceOp, name: str | None
             ) -> BaseException | None:
    """Why this rank cannot run the allreduce (every rank then raises), or None."""
    if not tensors:
        return ValueError("allreduce needs at least one tensor")
    if any(t.is_sparse for t in tensors):
        return ValueError("allreduce of a sparse tensor: use sparse_allreduce_async, or "
                          "sparse_as_dense=True with DistributedOptimizer")
    if op in (ReduceOp.AVERAGE, ReduceOp.ADASUM) and any(t.dtype == torch.bool for t in tensors):
        return ValueError(f"{op.name.title()} of bool tensors is undefined: use Sum (any), "
                          "Min (all), Max or Product")
    return handles.name_problem(name)


def start_grouped(tensors: Sequence[torch.Tensor], op: ReduceOp, name: str | None = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  within: Scope | None = None, deferrable: bool = False) -> handles.Pending:
    """Negotiates, then starts reducing `tensors` in place, fused into a few buckets
    (Adasum completes here). Scaling is Horovod's: prescale before, and for Average the
    postscale divided by the size, after (integers scaled in double and truncated).
    `deferrable`: a named asynchronous one, matched by name (handles.submit)."""
    tensors = list(tensors)
    problem = _problem(tensors, op, name)
    if within is not None and within.group is not None and op is ReduceOp.ADASUM:
        problem = problem or NotSupportedError("Adasum with a process set: elasticrun's Adasum "
                                               "runs over every rank")
    request, planned = request_for(tensors, op, name, (prescale_factor, postscale_factor),
                                   problem)
    return handles.submit(request, problem, within,
                          lambda: _launch(tensors, op, name, prescale_factor, postscale_factor,
                                          within), deferrable)


def _launch(tensors: list[torch.Tensor], op: ReduceOp, name: str | None,
            prescale_factor: float, postscale_factor: float,
            within: Scope | None) -> handles.Pending:
    """The data of an allreduce the ranks agreed on."""
    what = f"allreduce {name}" if name else "allreduce"
    world = size() if within is None else within.size
    group = None if within is None else within.group
    after = postscale_factor / world if op is ReduceOp.AVERAGE else postscale_factor
    if op is ReduceOp.ADASUM:
        for tensor in tensors:
            scale_(tensor, prescale_factor)
        adasum_allreduce_(tensors)
        for tensor in tensors:
            scale_(tensor, postscale_factor)
        return handles.Pending(what, [], lambda: tensors, op=op.value, name=name)
    torch_op = TORCH_OPS[op]

    def start(flat: torch.Tensor) -> list[fusion.Waitable]:
        scale_(flat, prescale_factor)
        if world == 1:
            return []
        with collective("allreduce", nbytes=fusion.nbytes(flat), op=op.value):
            return [plane.all_reduce(flat, op=torch_op, async_op=True, group=group)]

    launched = fusion.launch(tensors, start, reducing=True)

    def finish() -> list[torch.Tensor]:  # the handle has waited for every bucket
        waited = time.time()
        for index, bucket in enumerate(launched):
            fusion.record(what, index, bucket, waited)
            scale_(bucket.flat, after)
            fusion.unflatten(bucket, tensors)
        return tensors

    works = [work for bucket in launched for work in bucket.works]
    return handles.Pending(what, works, finish, nbytes=sum(fusion.nbytes(t) for t in tensors),
                           op=op.value, name=name)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: ReduceOp | None = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet | None = global_process_set) -> int:
    """Starts reducing `tensors` in place (fused into a few buckets); returns a handle."""
    op = resolve_op(op, average)
    within = scope(process_set, "allreduce")
    return handles.register(start_grouped(tensors, op, name, prescale_factor,
                                          postscale_factor, within, deferrable=True))


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None,
                            name: str | None = None, op: ReduceOp | None = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet | None = global_process_set) -> int:
    """Starts reducing copies of `tensors` (left unchanged); returns a handle."""
    outputs = [t.detach().clone() for t in tensors]
    return grouped_allreduce_async_(outputs, average, name, op, prescale_factor,
                                    postscale_factor, process_set)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                       name: str | None = None, op: ReduceOp | None = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet | None = global_process_set
                       ) -> list[torch.Tensor]:
    """Reduces `tensors` in place and returns them."""
    op = resolve_op(op, average)
    within = scope(process_set, "allreduce")
    return handles.synchronize(handles.register(start_grouped(
        tensors, op, name, prescale_factor, postscale_factor, within)))


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: ReduceOp | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0,
                     process_set: ProcessSet | None = global_process_set) -> int:
    """Starts reducing `tensor` across all ranks in place; returns a handle for
    poll() and synchronize() (which returns `tensor`). Arguments as allreduce()."""
    return _allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                             process_set, deferrable=True)


def _allreduce_async_(tensor: torch.Tensor, average: bool | None, name: str | None,
                      op: ReduceOp | None, prescale_factor: float, postscale_factor: float,
                      process_set: ProcessSet | None, deferrable: bool) -> int:
    op = resolve_op(op, average)
    within = scope(process_set, "allreduce")
    pending = start_grouped([tensor], op, name, prescale_factor, postscale_factor, within,
                            deferrable)
    return handles.register(handles.first_of(pending))


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: ReduceOp | None = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0,
                    process_set: ProcessSet | None = global_process_set) -> int:
    """Starts reducing a copy of `tensor` (left unchanged) across all ranks; returns a
    handle whose synchronize() returns the reduced copy. Arguments as allreduce()."""
    return allreduce_async_(tensor.detach().clone(), average, name, op, prescale_factor,
                            postscale_factor, process_set)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: ReduceOp | None = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0,
               process_set: ProcessSet | None = global_process_set) -> torch.Tensor:
    """Reduces `tensor` across all ranks in place and returns it."""
    return handles.synchronize(_allreduce_async_(tensor, average, name, op, prescale_factor,
                                                 postscale_factor, process_set,
                                                 deferrable=False))


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: ReduceOp, name: str | None,
                prescale: float, postscale: float, process_set: ProcessSet | None
                ) -> torch.Tensor:
        ctx.settings = (op, prescale, postscale, process_set)
        return allreduce_(tensor.detach().clone(), None, name, op, prescale, postscale,
                          process_set)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        op, prescale, postscale, process_set = ctx.settings
        return (allreduce_(grad.detach().clone(), None, None, op, prescale, postscale,
                           process_set), None, None, None, None, None)


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] = Compression.none, op: ReduceOp | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet | None = global_process_set) -> torch.Tensor:
    """Returns a new tensor: `tensor` reduced across all ranks (average by default).
    Differentiable: the gradient is the same reduction of the output's gradient."""
    op = resolve_op(op, average)
    check(process_set, "allreduce")
    compressed, context = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, op, name, prescale_factor, postscale_factor,
                               process_set)
    return compression.decompress(reduced, context)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, op: ReduceOp, name: str | None, prescale: float, postscale: float,
                process_set: ProcessSet | None, *tensors: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
        ctx.settings = (op, prescale, postscale, process_set)
        return tuple(grouped_allreduce_([t.detach().clone() for t in tensors], None, name, op,
                                        prescale, postscale, process_set))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        op, prescale, postscale, process_set = ctx.settings
        reduced = grouped_allreduce_([g.detach().clone() for g in grads], None, None, op,
                                     prescale, postscale, process_set)
        return (None, None, None, None, None, *reduced)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None,
                      name: str | None = None, compression: type[Compressor] = Compression.none,
                      op: ReduceOp | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet | None = global_process_set
                      ) -> list[torch.Tensor]:
    """New tensors: each of `tensors` reduced across all ranks, in a few fused collectives."""
    op = resolve_op(op, average)
    check(process_set, "grouped_allreduce")
    pairs = [compression.compress(t) for t in tensors]
    reduced = _GroupedAllreduce.apply(op, name, prescale_factor, postscale_factor,
                                      process_set, *[c for c, _ in pairs])
    return [compression.decompress(r, context)
            for r, (_, context) in zip(reduced, pairs, strict=True)]
