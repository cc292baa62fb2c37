"""The general path of a step's gradient reduction: gradients compressed per tensor.

Compressors other than Compression.none and fp16 do not travel in typed flat buckets: each
bucket of DistributedOptimizer is an allreduce of its own (negotiated each) of its compressed
gradients, decompressed back into `.grad` once reduced. A sparse gradient is reduced apart,
or with sparse_as_dense made dense first (reduction.py keeps which, through `on_sparse`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from elasticrun.torch.collectives import handles
from elasticrun.torch.collectives.allreduce import start_grouped
from elasticrun.torch.collectives.process_sets import ProcessSet, scope
from elasticrun.torch.collectives.reduce_ops import ReduceOp
from elasticrun.torch.compression import Compressor


@dataclass
class CompressedBucket:
    """One bucket's allreduce in flight: its dense gradients and their compressors'
    contexts, to decompress the reduced tensors into."""

    pending: handles.Pending
    grads: list[torch.Tensor]
    contexts: list[Any]

    def finish(self, compression: type[Compressor]) -> None:
        """Waits for the allreduce and leaves the decompressed result in the gradients."""
        reduced = self.pending.wait()
        for grad, out, context in zip(self.grads, reduced, self.contexts, strict=True):
            restored = compression.decompress(out, context)
            if restored.data_ptr() != grad.data_ptr():
                grad.copy_(restored)


def start_compressed(params: Sequence[torch.Tensor], compression: type[Compressor],
                     op: ReduceOp, predivide: float, sparse_as_dense: bool,
                     process_set: ProcessSet | None,
                     on_sparse: Callable[[int, int], None]) -> CompressedBucket | None:
    """Starts reducing the gradients of one bucket's `params`, compressed; None if every
    gradient is sparse (reduced apart). `on_sparse(position, sparse_dim)` is told of each
    sparse gradient."""
    grads = []
    for position, p in enumerate(params):
        if p.grad is None:  # every rank must reduce the same tensors
            p.grad = torch.zeros_like(p)
        if p.grad.is_sparse:
            on_sparse(position, p.grad.sparse_dim())
            if not sparse_as_dense:
                continue
            p.grad = p.grad.to_dense()
        grads.append(p.grad)
    if not grads:  # every gradient is sparse, reduced apart
        return None
    compressed = [compression.compress(g) for g in grads]
    tensors = [c for c, _ in compressed]
    pending = start_grouped(tensors, op, None, 1.0 / predivide, predivide,
                            scope(process_set, "DistributedOptimizer"))
    return CompressedBucket(pending, grads, [ctx for _, ctx in compressed])
