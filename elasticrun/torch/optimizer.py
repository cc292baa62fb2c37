"""DistributedOptimizer: averages gradients across ranks before the wrapped optimizer steps.

The returned object is an instance of a subclass of the wrapped optimizer's class that
shares its parameter groups and state, so schedulers and isinstance checks keep working.
Gradients travel fused into buckets (one collective per bucket, all in flight at once).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from elasticrun.torch.ops import Average, ReduceOp, grouped_allreduce_


class _DistributedMixin:
    _er_params: list[torch.Tensor]
    _er_names: dict[int, str]
    _er_op: ReduceOp
    _er_passes: int
    _er_synchronized: bool
    _er_skip_sync: bool
    param_groups: list[dict[str, Any]]

    def _er_setup(
        self,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
        backward_passes_per_step: int,
        op: ReduceOp,
    ) -> None:
        params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            names = [name for name, _ in named]
            if len(set(names)) != len(names):
                raise ValueError("named_parameters has duplicate names")
            known = {id(p) for _, p in named}
            missing = [p for p in params if id(p) not in known]
            if missing:
                raise ValueError(f"{len(missing)} optimizer parameter(s) are not in "
                                 "named_parameters")
            self._er_names = {id(p): name for name, p in named}
        else:
            self._er_names = {id(p): f"param.{i}" for i, p in enumerate(params)}
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        self._er_params = [p for p in params if p.requires_grad]
        self._er_op = op
        self._er_passes = backward_passes_per_step
        self._er_synchronized = False
        self._er_skip_sync = False

    @property
    def backward_passes_per_step(self) -> int:
        return self._er_passes

    def synchronize(self) -> None:
        """Averages the gradients across ranks now (e.g. before clipping them)."""
        grads = []
        for p in self._er_params:
            if p.grad is None:  # every rank must reduce the same tensors
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        if grads:
            grouped_allreduce_(grads, self._er_op)
        self._er_synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Use around step() after calling synchronize() yourself."""
        self._er_skip_sync = True
        try:
            yield
        finally:
            self._er_skip_sync = False

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        if not self._er_synchronized and not self._er_skip_sync:
            self.synchronize()
        self._er_synchronized = False
        return super().step(closure)  # type: ignore[misc]


def DistributedOptimizer(  # noqa: N802 - a factory named like the class it makes, as in Horovod
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    backward_passes_per_step: int = 1,
    op: ReduceOp = Average,
) -> torch.optim.Optimizer:
    """Wraps `optimizer` so that step() first averages gradients across all ranks.

    With backward_passes_per_step N, call step() after every N backward passes: the
    accumulated gradient is reduced once, at step().
    """
    base: type = type(optimizer)
    cls: type = type(base.__name__, (_DistributedMixin, base), {})
    wrapped: Any = object.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._er_setup(named_parameters, backward_passes_per_step, op)
    return wrapped  # type: ignore[no-any-return]
