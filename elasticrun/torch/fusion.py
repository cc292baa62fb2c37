"""Tensor fusion: many small tensors travel as a few flat buckets, one collective each."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from elasticrun.torch.boundary import collective

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024
ALONE_BYTES = 1024 * 1024


def buckets(tensors: Sequence[torch.Tensor], bucket_bytes: int,
            alone_bytes: int = ALONE_BYTES) -> list[list[int]]:
    """Groups tensor indices into buckets of one dtype and at most ~bucket_bytes each.
    A contiguous tensor of alone_bytes or more gets a bucket of its own, so that it is
    reduced in place: fusing it would cost more in copies than it saves in collectives."""
    groups: list[list[int]] = []
    open_bucket: dict[torch.dtype, tuple[list[int], int]] = {}
    for index, tensor in enumerate(tensors):
        size = tensor.numel() * tensor.element_size()
        if size >= alone_bytes and tensor.is_contiguous():
            groups.append([index])
            continue
        members, used = open_bucket.get(tensor.dtype, ([], 0))
        if members and used + size > bucket_bytes:
            groups.append(members)
            members, used = [], 0
        members.append(index)
        open_bucket[tensor.dtype] = (members, used + size)
    groups.extend(members for members, _ in open_bucket.values() if members)
    return groups


def fused_collective(
    tensors: Sequence[torch.Tensor],
    launch: Callable[[torch.Tensor], dist.Work | None],
    finish: Callable[[torch.Tensor], None] | None = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    what: str = "fused collective",
) -> None:
    """Runs `launch` (an async collective) on each bucket, all in flight at once, then
    copies the results back into `tensors` in place. `finish` post-processes a bucket.
    A contiguous tensor alone in its bucket is the bucket: it changes in place, so after a
    failed collective it may hold partial results (elastic training restores the commit).
    A launch or wait that fails to communicate raises WorkersFailedError."""
    pending: list[tuple[list[int], torch.Tensor, dist.Work | None]] = []
    try:
        for group in buckets(tensors, bucket_bytes):
            members = [tensors[i] for i in group]
            if len(members) == 1 and members[0].is_contiguous():
                # A tensor alone in its bucket (a large layer) is used in place: copying
                # it out and back would cost two passes over the largest tensors.
                flat = members[0].detach().view(-1)
            else:
                flat = torch.cat([t.detach().reshape(-1) for t in members])
            with collective(what):
                work = launch(flat)
            pending.append((group, flat, work))
        for group, flat, work in pending:
            if work is not None:
                with collective(what):
                    work.wait()
            if finish is not None:
                finish(flat)
            if len(group) == 1 and flat.data_ptr() == tensors[group[0]].data_ptr():
                continue  # reduced in place
            offset = 0
            for i in group:
                target = tensors[i]
                count = target.numel()
                target.data.copy_(flat[offset:offset + count].view_as(target))
                offset += count
    finally:
        # A Work keeps its Gloo context, and so its sockets, alive: a failed round's works
        # must not outlive the failure, or peers waiting on this process never see it go.
        pending.clear()
        work = None  # noqa: F841
