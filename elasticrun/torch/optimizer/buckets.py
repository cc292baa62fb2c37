"""How DistributedOptimizer lays gradients out for reduction: buckets, one collective each.

The layout is DDP's: parameters backwards (gradients arrive roughly from the last layer to
the first), a bucket closing once it holds 25 MiB or more, a new bucket where the dtype or
device changes; on GPUs a small first bucket (1 MiB), so that communication starts early
while backward runs on. On CPUs the first bucket is as large as the others: there the
reduction competes with backward for the same cores and every collective costs thread
hand-offs, so overlapping buys little and one collective fewer is measurably faster
(benchmarks/: the 1M-parameter MLP, 0.96x DDP with DDP's first bucket, parity without).
Each bucket owns one flat tensor for the whole job. When gradients travel in their own
dtype, every parameter's `.grad` becomes a view into it (as DDP's
`gradient_as_bucket_view`): autograd accumulates straight into the bucket, and the reduced
values are the gradients, with no copy back. When they travel compressed
(Compression.fp16), the flat is float16 and gradients are converted in and out. The last
bucket to start carries one element more: the host-change vote (host_vote.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

FIRST_BUCKET_BYTES = 1024 * 1024  # DDP's first bucket (GPUs)
BUCKET_BYTES = 25 * 1024 * 1024  # DDP's bucket_cap_mb


def layout(params: list[torch.Tensor], groups: int | Sequence[Sequence[torch.Tensor]] | None,
           first_bytes: int = FIRST_BUCKET_BYTES, bucket_bytes: int = BUCKET_BYTES
           ) -> list[list[torch.Tensor]]:
    """Buckets in launch order. `groups` (Horovod's): a number of equal groups, or lists of
    parameters that each make a bucket (the others one bucket each)."""
    backwards = list(reversed(params))
    if isinstance(groups, int) and groups > 0:  # Horovod's split: sizes differ by one at most
        per, extra = divmod(len(backwards), groups)
        chunks = [backwards[i * per + min(i, extra):(i + 1) * per + min(i + 1, extra)]
                  for i in range(groups)]
        return [chunk for chunk in chunks if chunk]
    if groups is not None and not isinstance(groups, int):
        listed = [[p for p in group if p.requires_grad] for group in groups]
        seen = {id(p) for group in listed for p in group}
        if len(seen) != sum(len(group) for group in listed):
            raise ValueError("groups: a parameter can only appear once in groups")
        return [g for g in listed if g] + [[p] for p in backwards if id(p) not in seen]
    first = first_bytes if backwards and backwards[0].is_cuda else bucket_bytes
    return split_by_size(backwards, first, bucket_bytes)


def split_by_size(backwards: list[torch.Tensor], first_bytes: int, bucket_bytes: int
                  ) -> list[list[torch.Tensor]]:
    """DDP's rule (its Reducer's `compute_bucket_assignment_by_size`): a bucket takes
    parameters until it holds at least its limit, `first_bytes` for the first bucket and
    `bucket_bytes` after, and then closes; a parameter of another dtype or device starts a
    new bucket. (Closing *before* a parameter that would overflow the limit instead makes a
    big layer a bucket of its own: one collective more than DDP, 15% of a step at 10M
    parameters over NCCL's sockets.)"""
    buckets: list[list[torch.Tensor]] = []
    used = 0
    cap = first_bytes
    for p in backwards:
        if not buckets or used >= cap or p.dtype != buckets[-1][0].dtype \
                or p.device != buckets[-1][0].device:
            if buckets:
                cap = bucket_bytes
            buckets.append([])
            used = 0
        buckets[-1].append(p)
        used += p.numel() * p.element_size()
    return buckets


@dataclass
class GradientBucket:
    """A bucket's parameters and its flat tensor on the wire (`vote`: one element more)."""

    params: list[torch.Tensor]
    wire: torch.dtype
    vote: bool = False
    flat: torch.Tensor | None = None
    views: list[torch.Tensor] = field(default_factory=list)
    _vote: torch.Tensor | None = None

    @property
    def numel(self) -> int:
        return sum(p.numel() for p in self.params) + int(self.vote)

    @property
    def as_views(self) -> bool:
        """Gradients live in the bucket (they travel in their own dtype)."""
        return self.wire == self.params[0].dtype

    def allocate(self, make: Callable[[int, torch.dtype], torch.Tensor] | None = None
                 ) -> None:
        """The flat tensor (zeros), from `make(numel, dtype)` if given (shared memory)."""
        if self.flat is not None and self.flat.numel() == self.numel:
            return
        first = self.params[0]
        self.flat = make(self.numel, self.wire) if make is not None else \
            torch.zeros(self.numel, dtype=self.wire, device=first.device)
        self.views, offset = [], 0
        for p in self.params:
            self.views.append(self.flat[offset:offset + p.numel()].view(p.shape))
            offset += p.numel()
        self._vote = self.flat[-1:] if self.vote else None

    def gather(self, index: int, sparse_as_dense: bool, scale: float = 1.0) -> int | None:
        """Parameter `index`'s gradient into the bucket, multiplied by `scale` on the way
        (Average's 1/size, as DDP divides before summing: one pass for the copy and the
        scaling); a missing gradient as zeros, as Horovod reduces (every rank must send the
        same tensors). A sparse gradient is made dense with `sparse_as_dense`; otherwise its
        place stays zero and it is reduced apart. Returns a sparse gradient's sparse_dim()
        (None for a dense or missing one): with `sparse_as_dense` the reduced gradient is made
        sparse again with it (sparse_grad()), as Horovod does, for optimizers such as
        SparseAdam."""
        p, view = self.params[index], self.views[index]
        grad, sparse_dim = p.grad, None
        if grad is not None and grad.is_sparse:
            sparse_dim = grad.sparse_dim()
            if not sparse_as_dense:
                view.zero_()
                return sparse_dim
            grad = grad.to_dense()
        if grad is None:
            view.zero_()
            p.grad = view if self.as_views else torch.zeros_like(p)
        elif not self.as_views:
            view.copy_(grad)
            if scale != 1.0:
                view.mul_(scale)
            p.grad = grad
        elif grad is view:  # autograd accumulated into the bucket
            if scale != 1.0:
                view.mul_(scale)
        else:
            torch.mul(grad, scale, out=view)
            p.grad = view
        return sparse_dim

    def scatter(self, sparse: set[int]) -> None:
        """The reduced values back into gradients that do not live in the bucket (but for
        those reduced apart: `sparse`, their indices)."""
        if self.as_views:
            return
        for index, (p, view) in enumerate(zip(self.params, self.views, strict=True)):
            if index not in sparse and p.grad is not None:
                p.grad.copy_(view)

    def sparse_grad(self, index: int, sparse_dim: int) -> None:
        """Parameter `index`'s reduced gradient, made dense to travel, sparse again (a tensor
        of its own: the bucket's next step does not write into it)."""
        p = self.params[index]
        assert p.grad is not None
        p.grad = p.grad.to_sparse(sparse_dim)

    def vote_slot(self) -> torch.Tensor:
        assert self._vote is not None
        return self._vote
