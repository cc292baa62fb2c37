"""groups.py's calls into torch that differ between the releases elasticrun supports (2.13,
2.14) behave alike on the installed one, without a warning: the default group's collective
timeout is set (publicly where torch has `set_timeout`), and `new_group` gives a member its
group."""

from __future__ import annotations

import datetime
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from elasticrun.torch.world import groups

CPU = torch.device("cpu")


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dist.ProcessGroup]:
    """A 1-rank Gloo default group on a FileStore, destroyed afterwards (and sys.excepthook,
    which torch wraps at every default group it builds, put back)."""
    assert not dist.is_initialized(), "a process group was left by an earlier test"
    hook = sys.excepthook
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        group = dist.group.WORLD
        assert group is not None
        yield group
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook


def test_the_default_timeout_is_set_without_a_warning(world: dist.ProcessGroup) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        groups.set_default_timeout(datetime.timedelta(seconds=3))
    assert world._get_backend(CPU).options._timeout == datetime.timedelta(seconds=3)
    tensor = torch.ones(2)
    dist.all_reduce(tensor)  # the group still works under its new timeout
    assert tensor.tolist() == [1.0, 1.0]


def test_new_group_gives_a_member_its_group(world: dist.ProcessGroup) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        group = groups.new_group([0], datetime.timedelta(seconds=5))
    assert isinstance(group, dist.ProcessGroup)
    assert group.size() == 1
    tensor = torch.ones(1)
    dist.all_reduce(tensor, group=group)
    assert tensor.item() == 1.0
    dist.destroy_process_group(group)
