"""DistributedOptimizer: gradients are reduced across ranks while backward still runs.

As in Horovod and DDP, each parameter's gradient hook counts the backward passes; when the
last pass of a step (`backward_passes_per_step`) has produced every gradient of a bucket,
the bucket's allreduce starts at once, overlapping the rest of backward. Buckets start in
one fixed order on every rank (DDP's rule), so ranks whose gradients arrive in different
orders still issue the same collectives in the same order. `step()` (or `synchronize()`,
e.g. before clipping) starts what has not started and waits for everything.

With `op=Adasum` the optimizer reduces the *update* instead, as Horovod does: each rank
takes its local step, and the change of the parameters is combined with Adasum.

The returned object is an instance of a subclass of the wrapped optimizer's class sharing
its parameter groups and state, so schedulers and isinstance checks keep working.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from elasticrun.torch.collectives import handles, host_vote
from elasticrun.torch.collectives.allgather import sparse_allreduce_async
from elasticrun.torch.collectives.allreduce import start_grouped
from elasticrun.torch.collectives.process_sets import ProcessSet, check, global_process_set
from elasticrun.torch.collectives.reduce_ops import Adasum, Average, ReduceOp, Sum, resolve_op
from elasticrun.torch.compression import Compression, Compressor
from elasticrun.torch.optimizer.buckets import (
    BUCKET_BYTES,
    Bucket,
    fused_float_dtype,
    layout,
    vote_bucket,
)
from elasticrun.torch.world import runtime
from elasticrun.torch.world.place import size
from elasticrun.worker import timeline


class _DistributedMixin:
    param_groups: list[dict[str, Any]]

    def _er_setup(self, named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
                  compression: type[Compressor], backward_passes_per_step: int, op: ReduceOp,
                  gradient_predivide_factor: float,
                  groups: int | Sequence[Sequence[torch.Tensor]] | None,
                  sparse_as_dense: bool, overlap: bool) -> None:
        params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(item, tuple) for item in named):
                raise ValueError("named_parameters should be a sequence of (name, parameter) "
                                 "tuples, usually produced by model.named_parameters()")
            names = [name for name, _ in named]
            if len(set(names)) != len(names):
                duplicates = sorted({n for n in names if names.count(n) > 1})
                raise ValueError(f"named_parameters has duplicate names: {duplicates}")
            known = {id(p) for _, p in named}
            missing = [p for p in params if id(p) not in known]
            if missing:
                raise ValueError(f"{len(missing)} optimizer parameter(s) are not in "
                                 "named_parameters")
            self._er_names = {id(p): name for name, p in named}
        else:
            self._er_names = {id(p): f"allreduce.noname.{i}" for i, p in enumerate(params)}
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        if gradient_predivide_factor != 1.0 and op is not Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        self._er_compression = compression
        self._er_op = op
        self._er_predivide = gradient_predivide_factor
        self._er_sparse_as_dense = sparse_as_dense
        self._er_passes = backward_passes_per_step
        trainable = [p for p in params if p.requires_grad]
        self._er_buckets = [Bucket(b) for b in layout(trainable, groups, BUCKET_BYTES)]
        self._er_bucket_of = {id(p): i for i, b in enumerate(self._er_buckets) for p in b.params}
        # A summed vote survives the scaling of Average and Sum; other ops (and a predivided
        # average) leave the agreement to its own collective.
        self._er_vote_bucket = vote_bucket([b.params for b in self._er_buckets]) \
            if op in (Average, Sum) and gradient_predivide_factor == 1.0 else -1
        self._er_delay = {id(p): backward_passes_per_step for p in trainable}
        self._er_next = 0  # the first bucket not started yet in this step
        self._er_round = -1
        self._er_synchronized = False
        self._er_should_sync = True
        self._er_hooks: list[Any] = []
        if overlap and op is not Adasum:
            self._er_hooks = [p.register_post_accumulate_grad_hook(self._er_on_gradient)
                              for p in trainable]

    @property
    def backward_passes_per_step(self) -> int:
        return self._er_passes

    def set_backward_passes_per_step(self, passes: int) -> None:
        if passes < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        self._er_passes = passes
        self._er_forget()

    def _er_forget(self) -> None:
        """Drops the step's started reductions and counts (a new round, or a restore)."""
        for bucket in self._er_buckets:
            bucket.ready, bucket.pending = 0, None
            bucket.grads, bucket.contexts, bucket.sparse = [], [], []
            bucket.vote = None
        self._er_delay = dict.fromkeys(self._er_delay, self._er_passes)
        self._er_next = 0
        self._er_synchronized = False
        self._er_round = runtime.current().round

    def _er_check_round(self) -> None:
        if runtime.current().round != self._er_round:
            self._er_forget()  # the old round's works are gone with its group

    def _er_on_gradient(self, p: torch.Tensor) -> None:
        self._er_check_round()
        key = id(p)
        if self._er_delay[key] <= 0:
            raise AssertionError("Gradients were computed more than backward_passes_per_step "
                                 "times before call to step(). Increase "
                                 "backward_passes_per_step to accumulate gradients locally.")
        self._er_delay[key] -= 1
        if self._er_delay[key] == 0:
            self._er_buckets[self._er_bucket_of[key]].ready += 1
            while self._er_next < len(self._er_buckets) and \
                    self._er_buckets[self._er_next].ready == \
                    len(self._er_buckets[self._er_next].params):
                self._er_start(self._er_next)
                self._er_next += 1

    def _er_start(self, index: int) -> None:
        bucket = self._er_buckets[index]
        grads: list[torch.Tensor] = []
        for p in bucket.params:
            if p.grad is None:  # every rank must reduce the same tensors
                p.grad = torch.zeros_like(p)
            if p.grad.is_sparse and not self._er_sparse_as_dense:
                bucket.sparse.append((p, sparse_allreduce_async(p.grad, op=self._er_op)))
                continue
            if p.grad.is_sparse:
                p.grad = p.grad.to_dense()
            grads.append(p.grad)
        compressed = [self._er_compression.compress(g) for g in grads]
        bucket.contexts = [context for _, context in compressed]
        tensors = [c for c, _ in compressed]
        if index == self._er_vote_bucket and size() > 1:
            bucket.vote = host_vote.ballot(fused_float_dtype(tensors), bucket.params[0].device)
            tensors.append(bucket.vote)
        name = self._er_names.get(id(bucket.params[0]), "")
        bucket.pending = start_grouped(tensors, self._er_op, name,
                                       1.0 / self._er_predivide, self._er_predivide)
        bucket.grads = grads

    def synchronize(self) -> None:
        """Finishes reducing the gradients across ranks now (e.g. before clipping them)."""
        self._er_check_round()
        if self._er_op is Adasum:
            self._er_synchronized = True
            return
        while self._er_next < len(self._er_buckets):
            self._er_start(self._er_next)
            self._er_next += 1
        vote: torch.Tensor | None = None
        for bucket in self._er_buckets:
            assert bucket.pending is not None
            reduced = bucket.pending.wait()
            if bucket.vote is not None:
                vote, reduced = reduced[-1], reduced[:-1]
            for grad, out, context in zip(bucket.grads, reduced, bucket.contexts, strict=True):
                restored = self._er_compression.decompress(out, context)
                if restored.data_ptr() != grad.data_ptr():
                    grad.copy_(restored)
            for p, handle in bucket.sparse:
                p.grad = handles.synchronize(handle)
        if vote is not None:
            host_vote.carried(vote)
        self._er_forget()
        self._er_synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Use around step() after calling synchronize() yourself."""
        self._er_should_sync = False
        try:
            yield
        finally:
            self._er_should_sync = True

    def _er_adasum_step(self, closure: Callable[[], float] | None) -> Any:
        params = [p for b in self._er_buckets for p in b.params if p.grad is not None]
        starts = [p.detach().clone() for p in params]
        loss = super().step(closure)  # type: ignore[misc]
        deltas = [p.detach() - start for p, start in zip(params, starts, strict=True)]
        compressed = [self._er_compression.compress(d) for d in deltas]
        reduced = start_grouped([c for c, _ in compressed], Adasum).wait()
        with torch.no_grad():
            for p, start, out, (_, context) in zip(params, starts, reduced, compressed,
                                                   strict=True):
                p.copy_(start + self._er_compression.decompress(out, context))
        self._er_forget()
        return loss

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        if timeline.enabled():
            timeline.mark_cycle()
        if self._er_op is Adasum:
            return self._er_adasum_step(closure)
        if self._er_should_sync:
            if self._er_synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "after optimizer.synchronize(): the gradients are reduced "
                              "twice", stacklevel=2)
            self.synchronize()
        self._er_synchronized = False
        return super().step(closure)  # type: ignore[misc]

    def zero_grad(self, set_to_none: bool = True) -> None:
        if any(b.pending is not None for b in self._er_buckets) and \
                runtime.current().round == self._er_round:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        super().zero_grad(set_to_none)  # type: ignore[misc]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._er_forget()
        super().load_state_dict(state_dict)  # type: ignore[misc]


def DistributedOptimizer(  # noqa: N802 - a factory named like the class it makes, as in Horovod
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    compression: type[Compressor] = Compression.none,
    backward_passes_per_step: int = 1,
    op: ReduceOp | None = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: int | Sequence[Sequence[torch.Tensor]] | None = None,
    sparse_as_dense: bool = False,
    process_set: ProcessSet | None = global_process_set,
    *,
    overlap: bool = True,
) -> torch.optim.Optimizer:
    """Wraps `optimizer` so that step() uses gradients averaged (by default) across ranks.

    Horovod's arguments and meaning. With backward_passes_per_step N, call step() after
    every N backward passes: the accumulated gradient is reduced once. `overlap=False`
    (elasticrun's) starts every reduction at step() instead of from the gradient hooks.
    """
    check(process_set, "DistributedOptimizer")
    op = resolve_op(op, None)
    if num_groups and groups is None:
        groups = num_groups
    base: type = type(optimizer)
    cls: type = type(base.__name__, (_DistributedMixin, base), {})
    wrapped: Any = object.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._er_setup(named_parameters, compression, backward_passes_per_step, op,
                      gradient_predivide_factor, groups, sparse_as_dense, overlap)
    return wrapped  # type: ignore[no-any-return]
