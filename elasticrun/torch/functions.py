"""Horovod's helper functions (horovod/torch/functions.py): objects, parameters and
optimizer state from one rank to all. Objects travel pickled, as byte tensors on the data
plane (so a broken round releases them as any collective); tensors travel as fused
broadcasts. Each is announced to joined ranks first (join.py), which refuse them."""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from elasticrun.torch.collectives.fusion import fused_collective
from elasticrun.torch.collectives.negotiation import negotiate
from elasticrun.torch.collectives.process_sets import ProcessSet, global_process_set, scope
from elasticrun.torch.collectives.requests import Kind, Request
from elasticrun.torch.world import plane, runtime
from elasticrun.torch.world.boundary import collective


def _rank() -> int:
    return runtime.current().slot.rank


def _size() -> int:
    return runtime.current().slot.size


def broadcast_object(obj: Any = None, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet | None = global_process_set) -> Any:
    """Returns root_rank's `obj` on every rank (pickled; use for small objects)."""
    within = scope(process_set, "broadcast_object")
    members = process_set.ranks if within.group is not None and process_set else None
    problem = None if 0 <= root_rank < _size() and (members is None or root_rank in members) \
        else ValueError(f"root_rank={root_rank!r}: expected a rank of "
                        f"{members if members is not None else 'the job'}")
    negotiate(Request(Kind.OBJECT, root=root_rank if problem is None else -1, name=name,
                      error=str(problem) if problem else ""), problem, within)
    if within.size == 1:
        return obj
    payload = _pickled(obj) if _rank() == root_rank else torch.empty(0, dtype=torch.uint8)
    with collective("broadcast_object"):
        length = torch.tensor([payload.numel()], dtype=torch.int64)
        plane.broadcast(length, root_rank, group=within.group)
        if _rank() != root_rank:
            payload = torch.empty(int(length), dtype=torch.uint8)
        plane.broadcast(payload, root_rank, group=within.group)
    return obj if _rank() == root_rank else _unpickled(payload)


def agreed(*values: int) -> bool:
    """Whether every rank passed the same `values` (one small allreduce)."""
    if _size() == 1:
        return True
    both = torch.tensor([*values, *(-v for v in values)], dtype=torch.int64)
    count = len(both)
    negotiate(Request(Kind.ALLREDUCE, dtypes=(torch.int64,), shapes=((count,),), op="max",
                      buckets=((count, torch.int64),)))
    with collective("comparing the ranks' commits"):
        plane.all_reduce(both, op=dist.ReduceOp.MAX)
    highest = both.tolist()
    return all(highest[i] == -highest[len(values) + i] for i in range(len(values)))


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet | None = global_process_set) -> list[Any]:
    """Returns every rank's `obj`, indexed by rank (within the process set)."""
    within = scope(process_set, "allgather_object")
    negotiate(Request(Kind.OBJECT, name=name), scope=within)
    if within.size == 1:
        return [obj]
    payload = _pickled(obj)
    with collective("allgather_object"):
        lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(within.size)]
        plane.all_gather(lengths, torch.tensor([payload.numel()], dtype=torch.int64),
                         group=within.group)
        longest = max(int(length) for length in lengths)
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[:payload.numel()] = payload
        gathered = [torch.empty(longest, dtype=torch.uint8) for _ in range(within.size)]
        plane.all_gather(gathered, padded, group=within.group)
    return [_unpickled(data[:int(length)]) for data, length in zip(gathered, lengths,
                                                                    strict=True)]


def _pickled(obj: Any) -> torch.Tensor:
    return torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)


def _unpickled(data: torch.Tensor) -> Any:
    return pickle.loads(data.numpy().tobytes())  # noqa: S301 - from this job's own ranks


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
    _broadcast_fused([t for t in tensors if isinstance(t, torch.Tensor)], root_rank,
                     "broadcast_parameters")


def _broadcast_fused(tensors: list[torch.Tensor], root_rank: int, what: str) -> None:
    """root_rank's values into `tensors`, in a few fused broadcasts, once negotiated."""
    if not tensors:
        return
    problem = None if 0 <= root_rank < _size() else ValueError(
        f"root_rank={root_rank!r}: expected a rank in 0..{_size() - 1}")
    negotiate(Request(Kind.BROADCAST, dtypes=tuple(t.dtype for t in tensors),
                      shapes=tuple(tuple(t.shape) for t in tensors),
                      device="GPU" if any(t.is_cuda for t in tensors) else "CPU",
                      root=root_rank if problem is None else -1,
                      error=str(problem) if problem else ""), problem)
    if _size() > 1:
        fused_collective(tensors, lambda flat: plane.broadcast(flat, src=root_rank, async_op=True),
                         what=what)


@dataclass(frozen=True)
class _TensorLeaf:
    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    cuda: bool  # on a GPU at the root: on this rank's GPU here


def broadcast_tree(tree: Any, root_rank: int = 0) -> Any:
    """Returns root_rank's nested dict/list/tuple structure on every rank. The structure
    travels pickled; its tensors travel as fused broadcasts, not through pickle."""
    tensors: list[torch.Tensor] = []

    def strip(node: Any) -> Any:
        if isinstance(node, torch.Tensor):
            tensors.append(node.detach())
            return _TensorLeaf(len(tensors) - 1, tuple(node.shape), node.dtype, node.is_cuda)
        if isinstance(node, dict):
            return {key: strip(value) for key, value in node.items()}
        if isinstance(node, (list, tuple)):
            stripped = [strip(value) for value in node]
            return stripped if isinstance(node, list) else tuple(stripped)
        return node

    is_root = _rank() == root_rank
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
        tensors = [torch.empty(leaf.shape, dtype=leaf.dtype,
                               device=plane.cuda_device() if leaf.cuda else "cpu")
                   for leaf in leaves]
    else:
        tensors = [t.contiguous() for t in tensors]
    _broadcast_fused(tensors, root_rank, "broadcast_tree")

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


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0,
                              model: torch.nn.Module | None = None) -> None:
    """Makes every rank's optimizer state (per-parameter state such as momentum, and the
    hyper-parameters of every group, such as a scheduler's learning rate) root_rank's.
    `model` is accepted for Horovod's signature (it needs it for sparse gradients).

    As Horovod does, an optimizer without state yet gets it first: every parameter that
    requires a gradient gets a zero one, and the optimizer's own step runs (never
    DistributedOptimizer's, which would reduce), so that the root's state has a place to go.
    """
    if not optimizer.state_dict()["state"]:
        _initialise_state(optimizer)
    state = broadcast_tree(optimizer.state_dict(), root_rank)
    if _rank() != root_rank:
        optimizer.load_state_dict(state)


def _initialise_state(optimizer: torch.optim.Optimizer) -> None:
    """Gives an optimizer its state by a step on zero gradients. The step exists only to
    make that state: the parameters are put back as they were, since with weight decay or
    momentum it would move them (after broadcast_parameters made them the root's)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    kept = [p.detach().clone() for p in params]
    for p in params:
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)
    own_step = getattr(optimizer, "_er_base_step", None)  # DistributedOptimizer's class's own
    with torch.no_grad():
        (own_step or optimizer.step)()
        for p, value in zip(params, kept, strict=True):
            p.copy_(value)
