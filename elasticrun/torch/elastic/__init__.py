"""`er.elastic`: run, State, ObjectState, TorchState, ElasticSampler and the two exceptions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from elasticrun.protocol import Notice
from elasticrun.torch import functions
from elasticrun.torch.collectives import host_vote
from elasticrun.torch.collectives.negotiation import negotiate
from elasticrun.torch.collectives.requests import Kind, Request
from elasticrun.torch.elastic.commit_files import (
    CheckpointMismatchError,
    UnreadableCommitError,
    load_checkpoint,
)
from elasticrun.torch.elastic.sampler import ElasticSampler
from elasticrun.torch.elastic.state import TorchState
from elasticrun.torch.world import place, plane, runtime
from elasticrun.torch.world.boundary import collective
from elasticrun.worker.elastic import (
    HostsUpdatedInterrupt,
    ObjectState,
    SnapshotMissingError,
    State,
    WorkersFailedError,
    set_default_backend,
)
from elasticrun.worker.elastic_loop import run_with

R = TypeVar("R")
_AGREEMENT = Request(Kind.ALLREDUCE, dtypes=(torch.int32,), shapes=((1,),), op="max",
                     buckets=((1, torch.int32),))


class TorchBackend:
    """Collectives over the current round's Gloo group; rounds through the driver."""

    # A collective the user issues directly (DDP, a raw dist call) reports a peer failure
    # as a DistError or, with torch 2.13's Gloo, a plain RuntimeError: either is a peer
    # failure only when the driver says the round broke.
    communication_errors: tuple[type[BaseException], ...] = (dist.DistError, RuntimeError)

    def broadcast_object(self, obj: Any, root_rank: int = 0) -> Any:
        return functions.broadcast_object(obj, root_rank)

    def carried_agreement(self) -> Callable[[], bool] | None:
        return host_vote.take()

    def start_agreement(self, flag: bool) -> Callable[[], bool]:
        host_vote.discard()  # whatever a step carried is older than this vote
        if place.size() == 1:
            return lambda: flag
        vote = torch.tensor([1 if flag else 0], dtype=torch.int32)
        # negotiated as an allreduce, so that a rank that called join() serves it too
        negotiate(_AGREEMENT)
        with collective("the host-change agreement"):
            work = plane.all_reduce(vote, op=dist.ReduceOp.MAX, async_op=True)

        def result() -> bool:
            with collective("the host-change agreement"):
                work.wait()
            return bool(vote.item())

        return result

    def hosts_changed(self) -> bool:
        return runtime.current().hosts_changed()

    def pending_notices(self) -> list[Notice]:
        return runtime.current().pending_notices()

    def reset(self, failure: str, committed: bool) -> None:
        runtime.reset(failure, committed)

    def synced(self) -> None:
        runtime.current().report_synced()

    def trained(self) -> None:
        runtime.current().report_trained()

    def round_broken(self, within: float) -> bool:
        return runtime.current().round_broken(within)

    def failing(self, failure: str, unrecoverable: bool = False) -> None:
        runtime.current().failing(failure, unrecoverable)


_backend = TorchBackend()
set_default_backend(_backend)


def run(func: Callable[..., R]) -> Callable[..., R]:
    """Decorator: `@er.elastic.run def train(state): ...` survives failures and host changes."""
    return run_with(_backend, func)


__all__ = [
    "CheckpointMismatchError", "ElasticSampler", "HostsUpdatedInterrupt", "ObjectState",
    "SnapshotMissingError", "State", "TorchBackend", "TorchState", "UnreadableCommitError",
    "WorkersFailedError", "load_checkpoint", "run",
]
