"""Building a Gloo group that fails must not change how the next group's keys are named
(real torch.distributed, one process)."""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist

from elasticrun.protocol import SlotInfo
from elasticrun.torch import runtime


def _runtime(rank: int, size: int, store: dist.Store) -> runtime.Runtime:
    rt = runtime.Runtime(SlotInfo("localhost", rank, size, rank, size, 0, 1))
    rt.store = store
    rt.collective_timeout = 0.5
    return rt


def test_a_failed_group_build_leaves_the_group_counter_alone() -> None:
    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=0.5))
    before = runtime._group_count()
    assert before is not None, "torch no longer has the counter this guards"
    with pytest.raises(Exception):  # noqa: B017 - the peer (rank 1) never comes
        runtime._init_process_group(_runtime(0, 2, dist.PrefixStore("a/", store)))
    assert runtime._group_count() == before
    assert not dist.is_initialized()
    # A group that does get built is named as if the failed attempt never happened.
    runtime._init_process_group(_runtime(0, 1, dist.PrefixStore("b/", store)))
    try:
        assert runtime._group_count() == before + 1
    finally:
        dist.destroy_process_group()
    assert runtime._group_count() == 0
