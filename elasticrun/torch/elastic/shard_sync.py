"""A round's sync of sharded state: each shard index travels from a rank that holds the
committed shard of that index to those that do not (on its cross group, or on a group of
just them when other ranks of the index hold it already).

The holders are the ranks whose commit generation is the root's (rank 0's; when no rank
holds a commit, rank 0's replica group is the source). A joining replica group receives
shard index i from live replica group `i mod (number of live groups)`: striped across the
live groups, as torchft heals, never every shard from one rank. A shard index that no rank
of the round holds cannot be made up: the round raises SnapshotMissingError.
"""

from __future__ import annotations

import datetime
import io
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from elasticrun.torch.elastic import shards
from elasticrun.torch.world import plane, runtime
from elasticrun.torch.world.groups import group_count_kept, new_group
from elasticrun.torch.world.replicas import ReplicaGroups, ReplicaLayout
from elasticrun.worker.elastic import SnapshotMissingError


def plan_source(layout: ReplicaLayout, generations: Sequence[int], root: int,
                index: int | None = None) -> tuple[int | None, list[int]]:
    """Pure: for shard index `index` (this rank's by default), the rank that sends it (None:
    nothing to send) and the ranks that receive."""
    if generations[root] >= 0:
        holders = {r for r, g in enumerate(generations) if g == generations[root]}
    else:  # nobody holds a commit: the root's replica group is the source
        holders = set(layout.group_ranks(root // layout.shard_size))
    index = layout.shard_rank if index is None else index
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
    layout = groups.layout
    source, receivers = plan_source(layout, generations, root)
    group = _sending_group(groups, generations, root, session.collective_timeout)
    if source is None or group is None:
        return
    receiving = layout.rank in receivers
    if model is not None:
        _broadcast_tensors([shards.local_part(t) for t in model.state_dict().values()],
                           source, layout.rank, group)
    if optimizer is not None:
        state = optimizer.state_dict() if layout.rank == source else None
        received = _broadcast_object(_local_state(state), source, layout.rank, group)
        if receiving:
            optimizer.load_state_dict(shards.optimizer_state(optimizer, received))


def _sending_group(groups: ReplicaGroups, generations: Sequence[int], root: int,
                   timeout: float) -> dist.ProcessGroup | None:
    """The group this rank's shard index travels on: its cross group, or, when some of its
    ranks hold the shard already, a group of the sender and the receivers only (made by
    every rank of the round, for every index, in the same order). None: not a member."""
    layout = groups.layout
    mine = None
    for index in range(layout.shard_size):
        source, receivers = plan_source(layout, generations, root, index)
        if source is None:
            continue
        members = sorted([source, *receivers])
        if len(members) == layout.num_replicas:
            group = groups.cross if index == layout.shard_rank else None
        else:
            with group_count_kept():
                group = new_group(members, datetime.timedelta(seconds=timeout))
        if index == layout.shard_rank and layout.rank in members:
            mine = group
    return mine


def _local_state(state: dict[str, Any] | None) -> dict[str, Any] | None:
    if state is None:
        return None
    local = {index: {key: shards.local_part(value) if isinstance(value, torch.Tensor)
                     else value for key, value in entry.items()}
             for index, entry in state["state"].items()}
    return {"state": local, "param_groups": state["param_groups"]}


def _broadcast(tensor: torch.Tensor, source: int, group: dist.ProcessGroup) -> None:
    """On an NCCL group, NCCL's own (aborted with the round's communicators); on a Gloo
    group, the data plane's, waited abortably."""
    if dist.get_backend(group) == "nccl":
        dist.broadcast(tensor, src=source, group=group)
    else:
        plane.broadcast(tensor, source, group=group)


@torch.no_grad()
def _broadcast_tensors(tensors: list[torch.Tensor], source: int, rank: int,
                       group: dist.ProcessGroup) -> None:
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in tensors:
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    for same in by_dtype.values():
        flat = torch.cat([t.detach().reshape(-1) for t in same])  # one broadcast per dtype
        _broadcast(flat, source, group)
        if rank != source:
            for target, value in zip(same, flat.split([t.numel() for t in same]), strict=True):
                target.copy_(value.view_as(target))


def _broadcast_object(obj: Any, source: int, rank: int, group: dist.ProcessGroup) -> Any:
    payload = torch.empty(0, dtype=torch.uint8)
    if rank == source:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    length = torch.tensor([payload.numel()], dtype=torch.int64)
    _broadcast(length, source, group)
    if rank != source:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    _broadcast(payload, source, group)
    if rank == source:
        return obj
    return torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=False)
