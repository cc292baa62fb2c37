"""Tensor fusion: many small tensors travel as a few flat buckets, one collective each.

`launch` starts a collective on every bucket (all in flight at once) and returns them;
`unflatten` copies a completed bucket back into its tensors; `fused_collective` does both
and waits. A contiguous tensor alone in its bucket is the bucket (changed in place)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from elasticrun.torch.collectives.wire import wire_dtype
from elasticrun.torch.world.boundary import collective
from elasticrun.worker import timeline

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024
ALONE_BYTES = 1024 * 1024


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def buckets(tensors: Sequence[torch.Tensor], bucket_bytes: int,
            alone_bytes: int = ALONE_BYTES, reducing: bool = False) -> list[list[int]]:
    """Groups tensor indices into buckets of one device and wire dtype (wire.py) and at most
    ~bucket_bytes each. A contiguous tensor of alone_bytes or more that travels as it is
    gets a bucket of its own, so that it is reduced in place: fusing it would cost more in
    copies than it saves in collectives."""
    groups: list[list[int]] = []
    open_bucket: dict[tuple[torch.device, torch.dtype], tuple[list[int], int]] = {}
    for index, tensor in enumerate(tensors):
        size = tensor.numel() * tensor.element_size()
        dtype = wire_dtype(tensor.dtype, reducing)
        if size >= alone_bytes and tensor.is_contiguous() and dtype == tensor.dtype:
            groups.append([index])
            continue
        kind = (tensor.device, dtype)
        members, used = open_bucket.get(kind, ([], 0))
        if members and used + size > bucket_bytes:
            groups.append(members)
            members, used = [], 0
        members.append(index)
        open_bucket[kind] = (members, used + size)
    groups.extend(members for members, _ in open_bucket.values() if members)
    return groups


class Waitable(Protocol):
    """A torch Work, or a collective header (join.Header)."""

    def is_completed(self) -> bool: ...

    def wait(self) -> Any: ...


@dataclass
class Bucket:
    members: list[int]  # indices into the tensors
    flat: torch.Tensor
    works: list[Waitable]
    launched: float = 0.0  # wall clock, when the timeline is on

    def in_place(self, tensors: Sequence[torch.Tensor]) -> bool:
        return len(self.members) == 1 and \
            self.flat.data_ptr() == tensors[self.members[0]].data_ptr()


def flatten(tensors: Sequence[torch.Tensor], members: list[int], reducing: bool = False
            ) -> torch.Tensor:
    chosen = [tensors[i] for i in members]
    dtype = wire_dtype(chosen[0].dtype, reducing)
    if len(chosen) == 1 and chosen[0].is_contiguous() and dtype == chosen[0].dtype:
        # A tensor alone in its bucket (a large layer) is used in place: copying it out
        # and back would cost two passes over the largest tensors.
        return chosen[0].detach().view(-1)
    return torch.cat([t.detach().reshape(-1).to(dtype) for t in chosen])


def plan(tensors: Sequence[torch.Tensor], reducing: bool = False,
         bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[tuple[list[int], int, torch.dtype]]:
    """The buckets `launch` will make: (members, element count, wire dtype) of each."""
    return [(group, sum(tensors[i].numel() for i in group),
             wire_dtype(tensors[group[0]].dtype, reducing))
            for group in buckets(tensors, bucket_bytes, reducing=reducing)]


def launch(tensors: Sequence[torch.Tensor], start: Callable[[torch.Tensor], list[Waitable]],
           bucket_bytes: int = DEFAULT_BUCKET_BYTES, reducing: bool = False) -> list[Bucket]:
    """Flattens `tensors` into buckets and starts `start(flat)` on each, in order."""
    started = []
    for group in buckets(tensors, bucket_bytes, reducing=reducing):
        flat = flatten(tensors, group, reducing)
        stamp = time.time() if timeline.enabled() else 0.0
        started.append(Bucket(group, flat, start(flat), stamp))
    return started


def unflatten(bucket: Bucket, tensors: Sequence[torch.Tensor]) -> None:
    """Copies a completed bucket's values back into its tensors (off the wire's dtype:
    int16 wraps as the wire's sum did, bool is "not 0")."""
    if bucket.in_place(tensors):
        return
    offset = 0
    for i in bucket.members:
        target = tensors[i]
        count = target.numel()
        part = bucket.flat[offset:offset + count].view(target.shape)
        target.data.copy_(part if target.dtype != torch.bool else part != 0)
        offset += count


def record(what: str, index: int, bucket: Bucket, waited: float) -> None:
    """One "fusion" event per bucket: its launch to its completion (timeline on only)."""
    if not bucket.launched:
        return
    done = time.time()
    timeline.record(what, "fusion", bucket.launched, done, bucket=index,
                    tensors=len(bucket.members),
                    bytes=bucket.flat.numel() * bucket.flat.element_size(),
                    queue_ms=round((waited - bucket.launched) * 1e3, 3),
                    run_ms=round((done - waited) * 1e3, 3))


def fused_collective(
    tensors: Sequence[torch.Tensor],
    launch_one: Callable[[torch.Tensor], dist.Work | None],
    finish: Callable[[torch.Tensor], None] | None = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    what: str = "fused collective",
) -> None:
    """Runs `launch_one` (an async collective) on each bucket, all in flight at once, then
    copies the results back into `tensors` in place. `finish` post-processes a bucket.
    A tensor alone in its bucket changes in place, so after a failed collective it may hold
    partial results (elastic training restores the commit). A launch or wait that fails to
    communicate raises WorkersFailedError."""

    def start(flat: torch.Tensor) -> list[Waitable]:
        with collective(what, nbytes=flat.numel() * flat.element_size()):
            work = launch_one(flat)
        return [] if work is None else [work]

    started: list[Bucket] = []
    try:
        started = launch(tensors, start, bucket_bytes)
        for index, bucket in enumerate(started):
            waited = time.time() if bucket.launched else 0.0
            for work in bucket.works:
                with collective(what, nbytes=bucket.flat.numel() * bucket.flat.element_size()):
                    work.wait()
            record(what, index, bucket, waited)
            if finish is not None:
                finish(bucket.flat)
            unflatten(bucket, tensors)
    finally:
        # A Work keeps its Gloo context, and so its sockets, alive: a failed round's works
        # must not outlive the failure, or peers waiting on this process never see it go.
        started.clear()
