"""Replica groups (`--shard-size S`): a round of `size` ranks is `size / S` groups of S
consecutive ranks. A model is sharded inside a group (FSDP over the group's shard group) and
replicated across groups (its gradients are averaged over the cross group of ranks that
hold the same shard index).

`ReplicaLayout` is the pure arithmetic; `ReplicaGroups` are one round's process groups,
built by every rank of the round, in the same order, with the round's default group, and
torn down with it. The driver keeps a worker's shard index for its whole life (a replica
group never spans hosts), so a model sharded at the first round fits every later one.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch.distributed as dist

from elasticrun import protocol
from elasticrun.job.errors import ConfigError
from elasticrun.torch.world.groups import abort_nccl, group_count_kept, nccl_options, new_group


def shard_size_from_env() -> int:
    """The job's --shard-size (1 when not launched by elasticrun)."""
    raw = os.environ.get(protocol.ENV_SHARD_SIZE, "1")
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{protocol.ENV_SHARD_SIZE}={raw!r}: expected a whole number >= 1")
    return value


@dataclass(frozen=True)
class ReplicaLayout:
    """Where `rank` of a round of `size` ranks sits, with replica groups of `shard_size`."""

    rank: int
    size: int
    shard_size: int

    def __post_init__(self) -> None:
        if self.shard_size < 1 or self.size % self.shard_size:
            raise ConfigError(f"a round of {self.size} rank(s) cannot be cut into replica "
                              f"groups of --shard-size {self.shard_size}")

    @property
    def shard_rank(self) -> int:
        """This rank's place in its replica group: the index of the shard it holds."""
        return self.rank % self.shard_size

    @property
    def replica_rank(self) -> int:
        """The index of this rank's replica group."""
        return self.rank // self.shard_size

    @property
    def num_replicas(self) -> int:
        return self.size // self.shard_size

    def group_ranks(self, replica: int) -> list[int]:
        """The ranks of replica group `replica`, in shard order."""
        first = replica * self.shard_size
        return list(range(first, first + self.shard_size))

    def cross_ranks(self, shard: int) -> list[int]:
        """The ranks holding shard index `shard`, one per replica group."""
        return list(range(shard, self.size, self.shard_size))


@dataclass
class ReplicaGroups:
    """One round's groups for this rank: its replica group's (`shard`) and the one across
    replica groups for its shard index (`cross`)."""

    layout: ReplicaLayout
    shard: dist.ProcessGroup
    cross: dist.ProcessGroup
    nccl: bool = False

    @classmethod
    def build(cls, layout: ReplicaLayout, timeout: float, nccl: bool = False) -> ReplicaGroups:
        """Every rank of the round calls this, in the same order (torch.distributed's
        new_group is collective). A failed build leaves torch's group counter alone."""
        options = nccl_options(timeout) if nccl else None
        wait = datetime.timedelta(seconds=timeout)
        backend = "nccl" if nccl else "gloo"
        shard = cross = None
        with group_count_kept():
            for replica in range(layout.num_replicas):
                group = new_group(layout.group_ranks(replica), wait, backend=backend,
                                  pg_options=options)
                if replica == layout.replica_rank:
                    shard = group
            for index in range(layout.shard_size):
                group = new_group(layout.cross_ranks(index), wait, backend=backend,
                                  pg_options=options)
                if index == layout.shard_rank:
                    cross = group
        assert shard is not None and cross is not None
        return cls(layout, shard, cross, nccl)

    def groups(self) -> list[dist.ProcessGroup]:
        return [self.shard, self.cross]

    def abort(self, drained: bool) -> None:
        """Aborts NCCL communicators (Gloo's connections are cut with the round's)."""
        if self.nccl:
            for group in self.groups():
                abort_nccl(group, drained=drained)
