"""Copies of committed state, and where copies of GPU tensors are kept.

A commit copies into the buffers of the previous commit (no new allocations once shapes
are stable). A CUDA tensor's copy is kept either on its device ("device": restore is a
device-to-device copy, the fastest, at the cost of the state's size in GPU memory) or in
pinned host memory ("host": copied asynchronously on the tensor's stream, so the step that
follows is ordered after the copy without the CPU waiting; restore waits for the copy and
copies back over PCIe). "auto" keeps it on the device while that leaves at least as much
GPU memory free as the copy takes, else in host memory.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from elasticrun.torch.elastic.shards import local_part

log = logging.getLogger("elasticrun.worker")

PLACES = ("auto", "device", "host")


@dataclass
class Placement:
    """Where a commit keeps copies of CUDA tensors: "device" or "host" ("auto" decides at
    the first commit that has CUDA tensors)."""

    place: str = "auto"
    pending: list[torch.cuda.Event] = field(default_factory=list)  # host copies in flight

    def __post_init__(self) -> None:
        if self.place not in PLACES:
            raise ValueError(f"commit_to={self.place!r}: expected one of {', '.join(PLACES)}")

    def decide(self, tensors: list[torch.Tensor]) -> None:
        if self.place != "auto":
            return
        on_gpu = [t for t in tensors if t.is_cuda]
        if not on_gpu:
            return
        needed = sum(t.numel() * t.element_size() for t in on_gpu)
        free, _ = torch.cuda.mem_get_info(on_gpu[0].device)
        self.place = "device" if free - needed >= needed else "host"
        log.info("commits keep %.1f MiB of GPU state in %s memory", needed / 2**20,
                 "device" if self.place == "device" else "pinned host")

    def new_copy(self, tensor: torch.Tensor) -> torch.Tensor:
        source = tensor.detach()
        if not source.is_cuda or self.place != "host":
            return source.clone()
        target = torch.empty(source.shape, dtype=source.dtype, pin_memory=True)
        target.copy_(source, non_blocking=True)
        return target

    def refill(self, targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
        torch._foreach_copy_(targets, [s.detach() for s in sources],
                             non_blocking=self.place == "host")

    def copied(self) -> None:
        """After a commit's copies were launched: notes where host copies complete."""
        if self.place == "host" and torch.cuda.is_available() and torch.cuda.is_initialized():
            event = torch.cuda.Event()
            event.record()
            self.pending = [event]

    def settle(self) -> None:
        """Before the copies are read (restore) or refilled: waits for those in flight."""
        for event in self.pending:
            event.synchronize()
        self.pending = []


_WHERE_THEY_ARE = Placement("device")  # copies restored from a commit stay where they are


def _reusable(previous: torch.Tensor, tensor: torch.Tensor, placement: Placement) -> bool:
    if previous.shape != tensor.shape or previous.dtype != tensor.dtype:
        return False
    if tensor.is_cuda and placement.place == "host":
        return previous.device.type == "cpu" and previous.is_pinned()
    return previous.device == tensor.device


def snapshot_tensors(tensors: dict[str, torch.Tensor], previous: dict[str, torch.Tensor] | None,
                     placement: Placement) -> dict[str, torch.Tensor]:
    """A copy of a flat name -> tensor mapping (a model's state_dict). When `previous` has
    the same layout, its buffers are refilled with one fused copy. A DTensor's copy is of
    its local shard."""
    tensors = {name: local_part(t) for name, t in tensors.items()}
    placement.decide(list(tensors.values()))
    if previous is not None and previous.keys() == tensors.keys() and all(
        _reusable(p, t, placement)
        for p, t in zip(previous.values(), tensors.values(), strict=True)
    ):
        placement.refill(list(previous.values()), list(tensors.values()))
        return previous
    return {name: placement.new_copy(t) for name, t in tensors.items()}


def snapshot(tree: Any, previous: Any = None, placement: Placement | None = None) -> Any:
    """A detached copy of a nested dict/list/tuple of tensors and values, reusing the
    tensors of `previous` where shape and dtype still match (refilled with one fused copy).
    Without a placement, tensors are copied where they are (for restoring from a commit)."""
    where = placement if placement is not None else _WHERE_THEY_ARE
    targets: list[torch.Tensor] = []
    sources: list[torch.Tensor] = []
    copied = _copy(tree, previous, where, targets, sources)
    if targets:
        where.refill(targets, sources)
    return copied


def _copy(tree: Any, previous: Any, where: Placement, targets: list[torch.Tensor],
          sources: list[torch.Tensor]) -> Any:
    """`tree`'s copy: new tensors copied now, reused ones listed for one fused refill."""
    if isinstance(tree, torch.Tensor):
        tree = local_part(tree)
        if isinstance(previous, torch.Tensor) and _reusable(previous, tree, where):
            targets.append(previous)
            sources.append(tree)
            return previous
        return where.new_copy(tree)
    if isinstance(tree, dict):
        old = previous if isinstance(previous, dict) else {}
        return {key: _copy(value, old.get(key), where, targets, sources)
                for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        old_items = list(previous) if isinstance(previous, (list, tuple)) \
            and len(previous) == len(tree) else [None] * len(tree)
        items = [_copy(value, prev, where, targets, sources)
                 for value, prev in zip(tree, old_items, strict=True)]
        return items if isinstance(tree, list) else tuple(items)
    if isinstance(tree, (int, float, str, bool, type(None))):
        return tree  # immutable: no copy
    return copy.deepcopy(tree)


def _tensors(tree: Any) -> Iterator[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        yield local_part(tree)
    elif isinstance(tree, dict):
        for value in tree.values():
            yield from _tensors(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from _tensors(value)


def fingerprint(tree: Any) -> int:
    """A checksum of the bytes of every tensor in a nested state: equal states give equal
    checksums, and a difference anywhere almost surely shows. One pass over each tensor
    where it lives (no copy of it), one read of the sums per device."""
    sums: dict[torch.device, list[torch.Tensor]] = {}
    for tensor in _tensors(tree):
        if tensor.is_sparse:
            tensor = tensor.to_dense()
        raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        try:
            words = raw.view(torch.int32)
        except RuntimeError:  # not a whole number of words
            words = raw
        sums.setdefault(raw.device, []).append(words.sum(dtype=torch.int64))
    values = [value for on_device in sums.values() for value in torch.stack(on_device).tolist()]
    return sum((index + 1) * value for index, value in enumerate(values)) % (1 << 62)
