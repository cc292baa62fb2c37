"""`er.elastic`: run, State, ObjectState, TorchState, ElasticSampler and the two exceptions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from elasticrun.torch import ops, runtime
from elasticrun.torch.sampler import ElasticSampler
from elasticrun.torch.state import TorchState
from elasticrun.worker.elastic import (
    HostsUpdatedInterrupt,
    ObjectState,
    State,
    WorkersFailedError,
    run_with,
    set_default_backend,
)

R = TypeVar("R")

class TorchBackend:
    """Collectives over the current round's Gloo group; rounds through the driver."""

    def rank(self) -> int:
        return ops.rank()

    def broadcast_object(self, obj: Any, root_rank: int = 0) -> Any:
        return ops.broadcast_object(obj, root_rank)

    def start_agreement(self, flag: bool) -> Callable[[], bool]:
        if ops.size() == 1:
            return lambda: flag
        vote = torch.tensor([1 if flag else 0], dtype=torch.int32)
        work = dist.all_reduce(vote, op=dist.ReduceOp.MAX, async_op=True)

        def result() -> bool:
            work.wait()
            return bool(vote.item())

        return result

    def hosts_changed(self) -> bool:
        return runtime.hosts_changed()

    def reset(self) -> None:
        runtime.reset()

    def synced(self) -> None:
        runtime.report_synced()

    def as_failure(self, exc: BaseException) -> WorkersFailedError | None:
        return WorkersFailedError(str(exc)) if runtime.is_peer_failure(exc) else None


_backend = TorchBackend()
set_default_backend(_backend)


def run(func: Callable[..., R]) -> Callable[..., R]:
    """Decorator: `@er.elastic.run def train(state): ...` survives failures and host changes."""
    return run_with(_backend, func)


__all__ = [
    "ElasticSampler", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchBackend",
    "TorchState", "WorkersFailedError", "run",
]
