"""Pure parts of elastic HSDP on the worker: where a rank sits among replica groups, and
from whom a round's sync sends each shard index."""

from __future__ import annotations

import pytest

from elasticrun.job.errors import ConfigError
from elasticrun.torch.elastic.shard_sync import plan_source
from elasticrun.torch.world.replicas import ReplicaLayout
from elasticrun.worker.elastic import SnapshotMissingError


def test_layout_of_consecutive_groups() -> None:
    layout = ReplicaLayout(rank=5, size=6, shard_size=2)
    assert (layout.shard_rank, layout.replica_rank, layout.num_replicas) == (1, 2, 3)
    assert layout.group_ranks(2) == [4, 5]
    assert layout.cross_ranks(1) == [1, 3, 5]


def test_a_round_that_is_not_whole_groups_is_refused() -> None:
    with pytest.raises(ConfigError, match="cannot be cut into replica groups"):
        ReplicaLayout(rank=0, size=3, shard_size=2)


def test_nothing_is_sent_when_every_rank_holds_the_commit() -> None:
    layout = ReplicaLayout(rank=1, size=4, shard_size=2)
    assert plan_source(layout, [5, 5, 5, 5], root=0) == (None, [])


def test_a_joining_group_gets_each_shard_of_its_own_index() -> None:
    # groups 0 and 1 hold commit generation 5; group 2 (ranks 4, 5) joined
    generations = [5, 5, 5, 5, -1, -1]
    for rank, expected in ((4, 0), (5, 3)):
        layout = ReplicaLayout(rank=rank, size=6, shard_size=2)
        source, receivers = plan_source(layout, generations, root=0)
        assert source == expected  # striped: shard 0 from group 0, shard 1 from group 1
        assert receivers == [rank]


def test_one_live_group_sends_every_shard() -> None:
    generations = [2, 2, -1, -1]
    assert plan_source(ReplicaLayout(2, 4, 2), generations, 0) == (0, [2])
    assert plan_source(ReplicaLayout(3, 4, 2), generations, 0) == (1, [3])


def test_a_new_job_takes_the_root_groups_shards() -> None:
    generations = [-1, -1, -1, -1]
    assert plan_source(ReplicaLayout(3, 4, 2), generations, 0) == (1, [3])


def test_a_shard_index_nobody_holds_cannot_be_made_up() -> None:
    # ranks 0 and 2 hold the commit; index 1's holders are all gone
    generations = [4, -1, 4, -1]
    with pytest.raises(SnapshotMissingError, match="shard 1"):
        plan_source(ReplicaLayout(3, 4, 2), generations, 0)
