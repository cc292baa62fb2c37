"""A round's sync of sharded state: each shard index travels on its own cross group, from a
rank that holds the committed shard of that index to those that do not.

The holders are the ranks whose commit generation is the root's (rank 0's; when no rank
holds a commit, rank 0's replica group is the source). A joining replica group receives
shard index i from live replica group `i mod (number of live groups)`: striped across the
live groups, as torchft heals, never every shard from one rank. A shard index that no rank
of the round holds cannot be made up: the round raises SnapshotMissingError.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from elasticrun.torch.elastic import shards
from elasticrun.torch.world import runtime
from elasticrun.torch.world.replicas import ReplicaGroups, ReplicaLayout
from elasticrun.worker.elastic import SnapshotMissingError


def plan_source(layout: ReplicaLayout, generations: Sequence[int], root: int
                ) -> tuple[int | None, list[int]]:
    """Pure: for this rank's shard index, the rank it receives from (None: nothing to
    send on its cross group) and the ranks that receive."""
    if generations[root] >= 0:
        holders = {r for r, g in enumerate(generations) if g == generations[root]}
    else:  # nobody holds a commit: the root's replica group is the source
        holders = set(layout.group_ranks(root // layout.shard_size))
    index = layout.shard_rank
    members = layout.cross_ranks(index)
    receivers = [r for r in members if r not in holders]
    if not receivers:
        return None, []
    senders = [r for r in members if r in holders]
    if not senders:
        raise SnapshotMissingError(f"no rank of this round holds shard {index} of the "
                                   f"committed state")
    live = sorted({r // layout.shard_size for r in holders
                   if all(m in holders for m in layout.group_ranks(r // layout.shard_size))})
    source = live[index % len(live)] * layout.shard_size + index if live else senders[0]
    return (source if source in senders else senders[0]), receivers


def sync_shards(model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None,
                generations: Sequence[int], root: int) -> None:
    """Sends this rank's shard index of model and optimizer from a holder to the ranks of
    its cross group that lack it (`generations`: every rank's, before the sync)."""
    session = runtime.current().session
    assert session is not None
    groups = session.replicas
    assert groups is not None, "sharded state needs replica groups (--shard-size)"
    source, receivers = plan_source(groups.layout, generations, root)
    if source is None:
        return
    receiving = groups.layout.rank in receivers
    if model is not None:
        _broadcast_tensors([shards.local_part(t) for t in model.state_dict().values()],
                           source, groups)
    if optimizer is not None:
        state = optimizer.state_dict() if groups.layout.rank == source else None
        received = _broadcast_object(_local_state(state), source, groups)
        if receiving:
            optimizer.load_state_dict(shards.optimizer_state(optimizer, received))


def _local_state(state: dict[str, Any] | None) -> dict[str, Any] | None:
    if state is None:
        return None
    local = {index: {key: shards.local_part(value) if isinstance(value, torch.Tensor)
                     else value for key, value in entry.items()}
             for index, entry in state["state"].items()}
    return {"state": local, "param_groups": state["param_groups"]}


def _wait(work: Any) -> None:
    session = runtime.current().session
    assert session is not None
    session.track(work)
    session.wait(work)


@torch.no_grad()
def _broadcast_tensors(tensors: list[torch.Tensor], source: int, groups: ReplicaGroups) -> None:
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in tensors:
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    for same in by_dtype.values():
        flat = torch.cat([t.detach().reshape(-1) for t in same])  # one broadcast per dtype
        _wait(dist.broadcast(flat, src=source, group=groups.cross, async_op=True))
        if groups.layout.rank != source:
            for target, value in zip(same, flat.split([t.numel() for t in same]), strict=True):
                target.copy_(value.view_as(target))


def _broadcast_object(obj: Any, source: int, groups: ReplicaGroups) -> Any:
    payload = torch.empty(0, dtype=torch.uint8)
    if groups.layout.rank == source:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    length = torch.tensor([payload.numel()], dtype=torch.int64)
    _wait(dist.broadcast(length, src=source, group=groups.cross, async_op=True))
    if groups.layout.rank != source:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    _wait(dist.broadcast(payload, src=source, group=groups.cross, async_op=True))
    if groups.layout.rank == source:
        return obj
    return torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=False)
