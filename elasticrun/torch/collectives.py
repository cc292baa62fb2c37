"""Broadcast, allgather, alltoall, reducescatter and barrier in the horovod.torch style.

Same keywords and results as Horovod (`name=`, `process_set=`; alltoall returns the received
splits when given splits; reducescatter gives the first ranks one row more when the rows do
not divide evenly). Tensors whose first dimension differs per rank are gathered by first
exchanging the sizes. The differentiable forms have Horovod's gradients. None of these can
run while a rank has called join() (as with Horovod): the ranks that issue one get a
ValueError naming it. A failed peer raises WorkersFailedError.
"""

from __future__ import annotations

from typing import Any

import torch

from elasticrun.torch import handles, join, plane, runtime
from elasticrun.torch.boundary import collective
from elasticrun.torch.compression import Compression, Compressor
from elasticrun.torch.ops import (
    Average,
    ReduceOp,
    Sum,
    allreduce,
    resolve_op,
    scale_,
    start_grouped,
)
from elasticrun.torch.process_sets import ProcessSet, check, global_process_set


def _world() -> tuple[int, int]:
    slot = runtime.current().slot
    return slot.rank, slot.size


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


# -- broadcast -------------------------------------------------------------------------

def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet | None = global_process_set) -> int:
    """Starts overwriting `tensor` with root_rank's; returns a handle."""
    check(process_set, "broadcast")
    rank, size = _world()
    if not 0 <= root_rank < size:
        raise ValueError(f"root_rank={root_rank}: expected a rank in 0..{size - 1}")
    if size == 1:
        return handles.register(handles.Pending("broadcast", [], lambda: tensor))
    join.announced(join.BROADCAST)
    target = tensor if tensor.is_contiguous() else tensor.contiguous()
    with collective("broadcast", nbytes=_bytes(target)):
        work = plane.broadcast(target, src=root_rank, async_op=True)

    def finish() -> torch.Tensor:
        if target is not tensor:
            tensor.copy_(target)
        return tensor

    return handles.register(handles.Pending(f"broadcast {name or ''}".strip(), [work], finish,
                                            nbytes=_bytes(target)))


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet | None = global_process_set) -> int:
    return broadcast_async_(tensor.detach().clone(), root_rank, name, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet | None = global_process_set) -> torch.Tensor:
    return handles.synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None
                ) -> torch.Tensor:
        ctx.root_rank = root_rank
        return broadcast_(tensor.detach().clone(), root_rank, name)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        reduced = allreduce(grad, op=Average)
        if _world()[0] != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet | None = global_process_set) -> torch.Tensor:
    """A new tensor holding root_rank's `tensor` (differentiable, as in Horovod)."""
    check(process_set, "broadcast")
    return _Broadcast.apply(tensor, root_rank, name)


# -- allgather -------------------------------------------------------------------------

def _first_dims(tensor: torch.Tensor, what: str) -> list[int]:
    """Every rank's first dimension (after the header that says a gather follows)."""
    if tensor.dim() == 0:
        raise ValueError(f"{what} needs a tensor with at least one dimension")
    _, size = _world()
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
    _, size = _world()
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
    with collective("allgather", nbytes=_bytes(padded)):
        work = plane.all_gather(parts, padded, async_op=True)

    def finish() -> torch.Tensor:
        return torch.cat([part[:dim] for part, dim in zip(parts, dims, strict=True)])

    return handles.register(handles.Pending(f"allgather {name or ''}".strip(), [work], finish,
                                            nbytes=_bytes(padded) * size))


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None) -> torch.Tensor:
        ctx.dim = tensor.shape[0]
        return handles.synchronize(allgather_async(tensor, name))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        reduced = allreduce(grad, op=Average)
        rank, _ = _world()
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
        values = values / _world()[1]
    result = torch.sparse_coo_tensor(indices.t(), values, sparse.shape).coalesce()
    return handles.register(handles.Pending("sparse allreduce", [], lambda: result))


# -- alltoall --------------------------------------------------------------------------

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
    check(process_set, "alltoall")
    _, size = _world()
    counts = _splits_of(tensor, splits, size)
    if size == 1:
        result = (tensor.detach().clone(), torch.tensor(counts, dtype=torch.int32))
        return handles.register(handles.Pending("alltoall", [], lambda: result))
    join.announced(join.ALLTOALL)
    sent = torch.tensor(counts, dtype=torch.int64)
    received = torch.empty(size, dtype=torch.int64)
    with collective("alltoall: exchanging splits"):
        plane.all_to_all_single(received, sent)
    incoming = [int(c) for c in received.tolist()]
    source = tensor.detach().contiguous()
    output = torch.empty((sum(incoming), *source.shape[1:]), dtype=source.dtype,
                         device=source.device)
    with collective("alltoall", nbytes=_bytes(source)):
        work = plane.all_to_all_single(output, source, output_split_sizes=incoming,
                                      input_split_sizes=counts, async_op=True)
    received_splits = received.to(torch.int32)
    return handles.register(handles.Pending(f"alltoall {name or ''}".strip(), [work],
                                            lambda: (output, received_splits),
                                            nbytes=_bytes(source)))


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: str | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        output, received = handles.synchronize(alltoall_async(tensor, splits, name))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: Any) -> tuple[Any, ...]:
        output, _ = handles.synchronize(alltoall_async(grad, ctx.received))
        return output, None, None


def alltoall(tensor: torch.Tensor, splits: torch.Tensor | list[int] | None = None,
             name: str | None = None, process_set: ProcessSet | None = global_process_set
             ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Rows of `tensor` scattered to the ranks (`splits[r]` rows to rank r, or equal parts)
    and the rows they sent here, gathered in rank order. With `splits`, also returns how many
    rows came from each rank."""
    check(process_set, "alltoall")
    output, received = _Alltoall.apply(tensor, splits, name)
    return output if splits is None else (output, received)


# -- reducescatter ---------------------------------------------------------------------

def _share(rows: int, size: int, rank: int) -> tuple[int, int]:
    """(offset, count) of this rank's rows: the first `rows % size` ranks get one more."""
    base, extra = divmod(rows, size)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: ReduceOp = Average,
                        process_set: ProcessSet | None = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Starts reducing `tensor` over all ranks; this rank's result is its share of the
    first dimension. Gloo has no reduce-scatter, so this is an allreduce and a slice."""
    check(process_set, "reducescatter")
    op = resolve_op(op, None)
    if op not in (Average, Sum):
        raise ValueError(f"reducescatter supports Average and Sum, not {op.name}")
    rank, size = _world()
    if tensor.dim() == 0:
        raise ValueError("reducescatter needs a tensor with at least one dimension")
    if size > 1:
        join.announced(join.REDUCESCATTER)
    reduced = tensor.detach().clone()
    scale_(reduced, prescale_factor)
    offset, count = _share(tensor.shape[0], size, rank)
    inner = handles.Pending("reducescatter", [], lambda: None)
    if size > 1:
        inner = start_grouped([reduced], op)

    def finish() -> torch.Tensor:
        inner.wait()
        mine = reduced.narrow(0, offset, count).clone()
        scale_(mine, postscale_factor)
        return mine

    return handles.register(handles.Pending(f"reducescatter {name or ''}".strip(), [], finish,
                                            nbytes=_bytes(reduced), op=op.value))


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: ReduceOp,
                prescale: float, postscale: float) -> torch.Tensor:
        ctx.settings = (op, prescale, postscale)
        return handles.synchronize(reducescatter_async(tensor, name, op, None, prescale,
                                                       postscale))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        op, prescale, postscale = ctx.settings
        grad = grad * (_world()[1] if op is Sum else 1) * prescale * postscale
        return allgather(grad), None, None, None, None


def reducescatter(tensor: torch.Tensor, name: str | None = None,
                  compression: type[Compressor] = Compression.none, op: ReduceOp = Average,
                  process_set: ProcessSet | None = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    check(process_set, "reducescatter")
    compressed, context = compression.compress(tensor)
    reduced = _Reducescatter.apply(compressed, name, op, prescale_factor, postscale_factor)
    return compression.decompress(reduced, context)


def grouped_reducescatter(tensors: list[torch.Tensor], name: str | None = None,
                          compression: type[Compressor] = Compression.none,
                          op: ReduceOp = Average,
                          process_set: ProcessSet | None = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0
                          ) -> list[torch.Tensor]:
    return [reducescatter(t, name, compression, op, process_set, prescale_factor,
                          postscale_factor) for t in tensors]


# -- barrier ---------------------------------------------------------------------------

def barrier(process_set: ProcessSet | None = global_process_set) -> None:
    """Returns once every rank has called barrier() (the header collective is the barrier)."""
    check(process_set, "barrier")
    if _world()[1] > 1:
        join.announced(join.BARRIER)


def grouped_reducescatter_async(tensors: list[torch.Tensor], name: str | None = None,
                                op: ReduceOp = Average,
                                process_set: ProcessSet | None = global_process_set,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0
                                ) -> int:
    started = [reducescatter_async(t, name, op, process_set, prescale_factor, postscale_factor)
               for t in tensors]
    return handles.register(handles.Pending(
        "grouped reducescatter", [], lambda: [handles.synchronize(h) for h in started]))
