"""DistributedOptimizer: gradients are reduced across ranks while backward still runs.

Horovod's arguments and meaning: the returned object is an instance of a subclass of the
wrapped optimizer's class sharing its parameter groups and state, so schedulers and
isinstance checks keep working; step() (or synchronize(), e.g. before clipping) waits for
the gradients reduced since the last step (reduction.py starts them from the gradient
hooks, in buckets laid out as buckets.py says). With `op=Adasum` the optimizer reduces the
*update* instead, as Horovod does: each rank takes its local step, and the change of the
parameters is combined with Adasum.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from elasticrun.torch.collectives.allreduce import start_grouped
from elasticrun.torch.collectives.process_sets import ProcessSet, check, global_process_set
from elasticrun.torch.collectives.reduce_ops import Adasum, Average, ReduceOp, resolve_op
from elasticrun.torch.compression import Compression, Compressor
from elasticrun.torch.optimizer.reduction import GradientReduction
from elasticrun.torch.world import runtime
from elasticrun.worker import timeline


def _parameter_names(param_groups: list[dict[str, Any]],
                     named_parameters: Iterable[tuple[str, torch.Tensor]] | None
                     ) -> dict[torch.Tensor, str]:
    """Horovod's `_parameter_names`, {parameter: name}: `named_parameters`' names, or without
    them "allreduce.noname.{i}.{j}" for parameter j of group i (the same on every rank)."""
    if named_parameters is None:
        named = [(f"allreduce.noname.{i}.{j}", p) for i, group in enumerate(param_groups)
                 for j, p in enumerate(group["params"])]
    else:
        named = list(named_parameters)
    if any(not isinstance(item, tuple) for item in named):
        raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                         "usually produced by model.named_parameters()")
    names = [name for name, _ in named]
    if len(set(names)) != len(names):
        duplicates = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"named_parameters has duplicate names: {duplicates}")
    known = {id(p) for _, p in named}
    missing = [p for group in param_groups for p in group["params"] if id(p) not in known]
    if missing:
        raise ValueError(f"{len(missing)} optimizer parameter(s) are not in named_parameters")
    return {p: name for name, p in sorted(named, key=lambda item: item[0])}


def _outside(process_set: ProcessSet | None) -> bool:
    """Whether this rank is outside `process_set`: Horovod builds the optimizer there too,
    and it steps locally. Raises when the set cannot be used here for any other reason
    (membership is the last thing scope() checks: an initialised set's ValueError on a rank
    that it does not include is that one)."""
    try:
        check(process_set, "DistributedOptimizer")
    except ValueError:
        if isinstance(process_set, ProcessSet) and process_set.process_set_id is not None \
                and process_set.included() is False:
            return True
        raise
    return False


class _DistributedMixin:
    param_groups: list[dict[str, Any]]

    def _er_setup(self, named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
                  compression: type[Compressor], backward_passes_per_step: int, op: ReduceOp,
                  gradient_predivide_factor: float,
                  groups: int | Sequence[Sequence[torch.Tensor]] | None,
                  sparse_as_dense: bool, overlap: bool,
                  process_set: ProcessSet | None = None, outside: bool = False) -> None:
        params = [p for group in self.param_groups for p in group["params"]]
        self._parameter_names = _parameter_names(self.param_groups, named_parameters)
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        if gradient_predivide_factor != 1.0 and op is not Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        self._er_compression = compression
        self._er_op = op
        trainable = [p for p in params if p.requires_grad]
        self._er_reduction = GradientReduction(trainable, groups, compression, op,
                                               gradient_predivide_factor,
                                               backward_passes_per_step, sparse_as_dense,
                                               process_set)
        self._er_synchronized = False
        self._er_should_sync = True
        self._er_outside = outside  # of process_set: no reduction, step() is local
        self._er_hooks: list[Any] = []
        if overlap and op is not Adasum and not outside:
            self._er_hooks = [p.register_post_accumulate_grad_hook(self._er_on_gradient)
                              for p in trainable]

    @property
    def backward_passes_per_step(self) -> int:
        return self._er_reduction.passes

    def set_backward_passes_per_step(self, passes: int) -> None:
        if passes < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        self._er_reduction.passes = passes
        self._er_reduction.forget()

    def _er_on_gradient(self, p: torch.Tensor) -> None:
        self._er_reduction.check_round()
        try:
            self._er_reduction.on_gradient(p)
        except BaseException:
            self._er_reduction.forget()  # the step is over; the next one starts clean
            raise

    def synchronize(self) -> None:
        """Finishes reducing the gradients across ranks now (e.g. before clipping them)."""
        reduction = self._er_reduction
        reduction.check_round()
        if self._er_op is Adasum or self._er_outside:
            self._er_synchronized = True
            return
        try:
            reduction.wait()
        except BaseException:
            reduction.forget()
            raise
        self._er_synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Use around step() after calling synchronize() yourself."""
        self._er_should_sync = False
        try:
            yield
        finally:
            self._er_should_sync = True

    def _er_base_step(self, closure: Callable[[], float] | None = None) -> Any:
        """The wrapped optimizer's own step: no reduction (broadcast_optimizer_state)."""
        return super().step(closure)  # type: ignore[misc]

    def _er_adasum_step(self, closure: Callable[[], float] | None) -> Any:
        params = [p for b in self._er_reduction.buckets for p in b.params if p.grad is not None]
        starts = [p.detach().clone() for p in params]
        loss = super().step(closure)  # type: ignore[misc]
        deltas = [p.detach() - start for p, start in zip(params, starts, strict=True)]
        compressed = [self._er_compression.compress(d) for d in deltas]
        reduced = start_grouped([c for c, _ in compressed], Adasum).wait()
        with torch.no_grad():
            for p, start, out, (_, context) in zip(params, starts, reduced, compressed,
                                                   strict=True):
                p.copy_(start + self._er_compression.decompress(out, context))
        self._er_reduction.forget()
        return loss

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        if timeline.enabled():
            timeline.mark_cycle()
        if self._er_op is Adasum and not self._er_outside:
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
        reduction = self._er_reduction
        if reduction.started and reduction.round == _current_round():
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        super().zero_grad(set_to_none)  # type: ignore[misc]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._er_reduction.forget()
        super().load_state_dict(state_dict)  # type: ignore[misc]


def _current_round() -> int:
    return runtime.current().round if runtime.is_initialized() else -1


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
    On a rank outside `process_set` it may be built too, as in Horovod: it registers no
    hooks, synchronize() reduces nothing and step() is the wrapped optimizer's alone.
    """
    outside = _outside(process_set)
    op = resolve_op(op, None)
    if num_groups and groups is None:
        groups = num_groups
    base: type = type(optimizer)
    cls: type = type(base.__name__, (_DistributedMixin, base), {})
    wrapped: Any = object.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._er_setup(named_parameters, compression, backward_passes_per_step, op,
                      gradient_predivide_factor, groups, sparse_as_dense, overlap, process_set,
                      outside)
    return wrapped  # type: ignore[no-any-return]
