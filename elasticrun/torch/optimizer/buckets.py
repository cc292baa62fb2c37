"""How DistributedOptimizer groups parameters into buckets, one reduction each, and which
bucket carries the host-change vote."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from elasticrun.torch.collectives import handles
from elasticrun.torch.collectives.fusion import ALONE_BYTES

BUCKET_BYTES = 4 * 1024 * 1024  # small enough to overlap backward on CPU models


@dataclass
class Bucket:
    params: list[torch.Tensor]
    ready: int = 0  # parameters whose last backward pass of this step is done
    pending: handles.Pending | None = None
    grads: list[torch.Tensor] = field(default_factory=list)  # what is being reduced
    contexts: list[Any] = field(default_factory=list)
    sparse: list[tuple[torch.Tensor, int]] = field(default_factory=list)
    vote: torch.Tensor | None = None  # the host-change vote riding with the gradients


def layout(params: list[torch.Tensor], groups: int | Sequence[Sequence[torch.Tensor]] | None,
            bucket_bytes: int) -> list[list[torch.Tensor]]:
    """Buckets in launch order. Gradients arrive roughly from the last layer to the first,
    so buckets follow the parameters backwards."""
    backwards = list(reversed(params))
    if isinstance(groups, int) and groups > 0:
        per = -(-len(backwards) // groups)
        return [backwards[i:i + per] for i in range(0, len(backwards), per)]
    if groups is not None and not isinstance(groups, int):
        listed = [[p for p in group if p.requires_grad] for group in groups]
        seen = {id(p) for group in listed for p in group}
        if len(seen) != sum(len(group) for group in listed):
            raise ValueError("groups: a parameter can only appear once in groups")
        return [g for g in listed if g] + [[p] for p in backwards if id(p) not in seen]
    layout: list[list[torch.Tensor]] = []
    used = bucket_bytes
    for p in backwards:
        nbytes = p.numel() * p.element_size()
        if not layout or used + nbytes > bucket_bytes or p.dtype != layout[-1][0].dtype \
                or p.device != layout[-1][0].device:
            layout.append([])
            used = 0
        layout[-1].append(p)
        used += nbytes
    return layout


def vote_bucket(layout: list[list[torch.Tensor]]) -> int:
    """The bucket that carries the host-change vote: the last one to start that fuses some
    of its tensors (so the vote costs no collective of its own), else the last one."""
    for index in range(len(layout) - 1, -1, -1):
        if any(p.numel() * p.element_size() < ALONE_BYTES for p in layout[index]):
            return index
    return len(layout) - 1


def fused_float_dtype(tensors: list[torch.Tensor]) -> torch.dtype:
    """The dtype the vote takes: that of a tensor it can share a fused bucket with."""
    for tensor in reversed(tensors):
        if tensor.dtype.is_floating_point and tensor.numel() * tensor.element_size() < ALONE_BYTES:
            return tensor.dtype
    return torch.float32
