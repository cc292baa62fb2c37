"""One step's gradient reduction, as DistributedOptimizer runs it.

Each parameter's gradient hook counts its backward passes; when the last pass of a step has
produced every gradient of a bucket, the bucket's reduction starts at once, overlapping the
rest of backward. A step of one bucket on CPUs (most models) starts at step() instead: there
is no backward left to overlap, and its copies and negotiation, moved into backward,
competed with it for the same cores. On GPUs the negotiation starts from the first gradient,
a round trip hidden behind the device's backward. Buckets start in one fixed order on every
rank (DDP's rule). The first bucket of a step is preceded by the step's one negotiation,
which covers every bucket (and lets a rank that called join() serve them); the buckets carry
nothing but gradients and, in the last, the host-change vote. When every rank of the round
shares one machine, CPU buckets are summed through shared memory (shared_sum.py), else by a
Gloo allreduce. `wait()` (at step(), or synchronize()) starts what has not started and
waits for everything.

Gradients compressed by a compressor other than Compression.none and fp16 take the general
path: each bucket is an allreduce of its own (compressed tensors, negotiated each;
compressed_reduction.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from elasticrun.torch.collectives import handles, host_vote, shared_sum
from elasticrun.torch.collectives.allgather import sparse_allreduce_async
from elasticrun.torch.collectives.negotiation import (
    Early,
    announce_early,
    drop_early,
    negotiate,
)
from elasticrun.torch.collectives.process_sets import ProcessSet, scope
from elasticrun.torch.collectives.reduce_ops import Average, ReduceOp, Sum
from elasticrun.torch.collectives.requests import Kind, Request
from elasticrun.torch.compression import Compression, Compressor
from elasticrun.torch.optimizer.buckets import GradientBucket, layout
from elasticrun.torch.optimizer.compressed_reduction import CompressedBucket, start_compressed
from elasticrun.torch.world import plane, runtime
from elasticrun.torch.world.boundary import collective
from elasticrun.torch.world.place import Scope
from elasticrun.worker import timeline


class GradientReduction:
    def __init__(self, params: list[torch.Tensor],
                 groups: int | Sequence[Sequence[torch.Tensor]] | None,
                 compression: type[Compressor], op: ReduceOp, predivide: float, passes: int,
                 sparse_as_dense: bool, process_set: ProcessSet | None = None) -> None:
        self.process_set = process_set
        self.within = Scope(None, 0, 1)  # set with the round's request
        self.compression = compression
        self.op = op
        self.predivide = predivide
        self.passes = passes
        self.sparse_as_dense = sparse_as_dense
        # Compression.none and fp16 travel in typed flat buckets; others compress per tensor.
        self.typed = compression in (Compression.none, Compression.fp16)
        self.buckets = [GradientBucket(b, self._wire(b[0])) for b in layout(params, groups)]
        self.where = {id(p): (i, j) for i, b in enumerate(self.buckets)
                      for j, p in enumerate(b.params)}
        self.delay = {id(p): passes for p in params}
        self.round = -1
        self._request: Request | None = None
        self.before = self.after = 1.0  # set with the round's request
        self.world = 1
        self._early_request = Request(Kind.ALLREDUCE, early=True)  # set with the request
        self.sharing = shared_sum.Sharing(placed=False)  # the round's, set with the request
        self._joined = False  # the step's negotiation: a rank has joined
        self.forget()

    def _wire(self, p: torch.Tensor) -> torch.dtype:
        if self.compression is Compression.fp16 and p.dtype.is_floating_point:
            return torch.float16
        return p.dtype

    # --- the step's state ------------------------------------------------------------------
    def forget(self) -> None:
        """Drops the step's started reductions and counts (a new round, or a restore)."""
        self.delay = dict.fromkeys(self.delay, self.passes)
        self.ready = [0] * len(self.buckets)
        self.gathered: list[set[int]] = [set() for _ in self.buckets]
        self.sparse: list[set[int]] = [set() for _ in self.buckets]  # reduced apart
        # sparse_as_dense: the sparse gradients made dense, {position: sparse_dim} per bucket
        self.densified: list[dict[int, int]] = [{} for _ in self.buckets]
        self.works: list[list[Any]] = [[] for _ in self.buckets]
        # the general path: each bucket's allreduce of compressed gradients, if started
        self.compressed: list[CompressedBucket | None] = [None] * len(self.buckets)
        self.launched: list[float] = [0.0] * len(self.buckets)
        self.next = 0
        drop_early(getattr(self, "early", None))
        self.early: Early | None = None  # the step's announcement, ahead of its data
        number = runtime.current().round if runtime.is_initialized() else -1
        if number != self.round:
            self.round, self._request = number, None
            # A left round's works may run on in Gloo until its timeout, writing into the
            # buckets they were given: the new round's reductions get buckets of their own.
            for bucket in self.buckets:
                bucket.flat = None
            self.sharing = shared_sum.Sharing(placed=False)

    @property
    def started(self) -> bool:
        return self.next > 0 or (self._deferred() and self._complete(0))

    def _deferred(self) -> bool:
        """One bucket of CPU gradients: reduced from step() (see the module's docstring)."""
        return len(self.buckets) == 1 and not self.buckets[0].params[0].is_cuda

    def _complete(self, index: int) -> bool:
        """The last pass produced every gradient of bucket `index`."""
        return self.ready[index] == len(self.buckets[index].params)

    def check_round(self) -> None:
        if runtime.current().round != self.round:
            self.forget()  # the old round's works are gone with its group

    def _voting(self) -> bool:
        """A summed vote survives the scaling of Average and Sum; other ops (and a
        predivided average, or a process set's reduction) leave the agreement to its own
        collective."""
        return self.world > 1 and self.op in (Average, Sum) and self.predivide == 1.0 \
            and self.within.group is None

    def _scales(self) -> tuple[float, float]:
        """The factors gradients are scaled by as they enter a bucket, and reduced buckets
        after: Horovod's prescale (1/predivide) and postscale (predivide/size for Average);
        a plain Average is all done before the sum (1/size, as DDP), in the same pass as
        the copy into the bucket."""
        if self.op is not Average:
            return 1.0 / self.predivide, 1.0
        if self.predivide == 1.0:
            return 1.0 / self.world, 1.0
        return 1.0 / self.predivide, self.predivide / self.world

    def request(self) -> Request:
        """The step's negotiated request (the same every step of a round)."""
        if self._request is None:
            self.within = scope(self.process_set, "DistributedOptimizer")
            self.world = self.within.size
            self.before, self.after = self._scales()
            vote = self._voting()
            params = [p for b in self.buckets for p in b.params]
            self.sharing = shared_sum.Sharing(self.typed and shared_sum.placed_for_it(
                params, self.within.group is not None))
            for index, bucket in enumerate(self.buckets):
                bucket.vote = vote and index == len(self.buckets) - 1
                if self.typed:
                    bucket.allocate(self.sharing.maker())
            self._request = Request(
                Kind.ALLREDUCE, dtypes=tuple(p.dtype for p in params),
                shapes=tuple(tuple(p.shape) for p in params),
                device="GPU" if params[0].is_cuda else "CPU", op=self.op.value,
                scales=(1.0 / self.predivide, self.predivide),
                buckets=tuple((b.numel, b.wire) for b in self.buckets) if self.typed else ())
            self._early_request = dataclasses.replace(self._request, early=True)
        return self._request

    # --- backward --------------------------------------------------------------------------
    def on_gradient(self, p: torch.Tensor) -> None:
        key = id(p)
        if self.delay[key] <= 0:
            raise AssertionError("Gradients were computed more than backward_passes_per_step "
                                 "times before call to step(). Increase "
                                 "backward_passes_per_step to accumulate gradients locally.")
        self.delay[key] -= 1
        if self.delay[key] == 0:
            index, position = self.where[key]
            if self._deferred():
                self.ready[index] += 1
                return
            if self.typed:
                self.request()  # the buckets exist
                if self.early is None and self.next == 0 and self.world > 1 \
                        and self.within.group is None:
                    # the step's first gradient: its round trip overlaps the rest of backward
                    self.early = announce_early(self._early_request)
                self._gather(index, position)
            self.ready[index] += 1
            while self.next < len(self.buckets) and self._complete(self.next):
                self.start(self.next)
                self.next += 1

    def _gather(self, index: int, position: int) -> None:
        if position not in self.gathered[index]:
            sparse_dim = self.buckets[index].gather(position, self.sparse_as_dense, self.before)
            if sparse_dim is not None:
                self._sparse(index, position, sparse_dim)
            self.gathered[index].add(position)

    def _sparse(self, index: int, position: int, sparse_dim: int) -> None:
        """A sparse gradient: reduced apart, or with sparse_as_dense reduced dense and made
        sparse again after (as Horovod does: SparseAdam takes sparse gradients only)."""
        if self.sparse_as_dense:
            self.densified[index][position] = sparse_dim
        else:
            self.sparse[index].add(position)

    def start_remaining(self) -> None:
        while self.next < len(self.buckets):
            self.start(self.next)
            self.next += 1

    def start(self, index: int) -> None:
        bucket = self.buckets[index]
        if not self.typed:
            self._start_compressed(index)
            return
        if index == 0:
            self._negotiate()
        for position in range(len(bucket.params)):
            self._gather(position=position, index=index)
        flat = bucket.flat
        assert flat is not None
        if bucket.vote:
            bucket.vote_slot().fill_(1.0 if host_vote.voted() else 0.0)
        self.launched[index] = time.time() if timeline.enabled() else 0.0
        if self.sharing.shared is not None and not self._joined:
            self.works[index] = [shared_sum.Waiting(self.sharing.shared.start(index))]
        elif self.world > 1:
            with collective("allreduce", nbytes=flat.numel() * flat.element_size(),
                            op=self.op.value):
                self.works[index] = [plane.all_reduce(flat, op=dist.ReduceOp.SUM,
                                                      async_op=True, group=self.within.group)]

    def _negotiate(self) -> None:
        """The step's negotiation, before its first data: the early announcement's result
        (announced again at once if a rank has joined, so that it serves the data), or one
        now. The round's first step with no rank joined maps the peers' shared buckets."""
        early, self.early = self.early, None
        agreement = early.result() if early is not None else None
        if agreement is None or agreement.joined:
            agreement = negotiate(self.request(), scope=self.within)
        self._joined = agreement.joined
        if not self._joined:
            self.sharing.connect_once(len(self.buckets))

    def _start_compressed(self, index: int) -> None:
        self.compressed[index] = start_compressed(
            self.buckets[index].params, self.compression, self.op, self.predivide,
            self.sparse_as_dense, self.process_set,
            lambda position, sparse_dim: self._sparse(index, position, sparse_dim))

    # --- step() ----------------------------------------------------------------------------
    def wait(self) -> None:
        """Starts what has not started, waits for every bucket, and leaves the reduced
        gradients in `.grad` (the vote, if carried, with host_vote)."""
        self.start_remaining()
        self.request()
        after = self.after
        for index, bucket in enumerate(self.buckets):
            waited = time.time()
            if self.typed:
                for work in self.works[index]:
                    with collective("allreduce"):
                        work.wait()
                assert bucket.flat is not None
                if after != 1.0:
                    bucket.flat.mul_(after)
                bucket.scatter(self.sparse[index])
                if bucket.vote:
                    host_vote.carried(bucket.vote_slot())
            elif (compressed := self.compressed[index]) is not None:  # None: all sparse
                compressed.finish(self.compression)
            self._record(index, waited)
            for position, sparse_dim in self.densified[index].items():
                bucket.sparse_grad(position, sparse_dim)
            for position in sorted(self.sparse[index]):
                p = bucket.params[position]
                assert p.grad is not None
                p.grad = handles.synchronize(sparse_allreduce_async(
                    p.grad, op=self.op, process_set=self.process_set))
        self.forget()

    def _record(self, index: int, waited: float) -> None:
        """One "fusion" event per bucket: its launch to its completion (timeline on)."""
        launched = self.launched[index]
        if not launched:
            return
        bucket, done = self.buckets[index], time.time()
        timeline.record("allreduce", "fusion", launched, done, bucket=index,
                        tensors=len(bucket.params), bytes=bucket.numel * bucket.wire.itemsize,
                        queue_ms=round((waited - launched) * 1e3, 3),
                        run_ms=round((done - waited) * 1e3, 3))
