"""The process groups of a round: building them (without disturbing torch's group counter),
aborting NCCL communicators, agreeing on NCCL, and tearing them down.

torch names a default group's store keys from a process-wide counter, so a failed build
must leave the counter as it found it; NCCL communicators are built non-blocking (NCCL's
condition for a safe abort). torch also wraps `sys.excepthook` at every default group it
builds (to prefix a traceback's lines with the rank): a worker builds one per round, so
each build wraps the hook it found before elasticrun's first, once, with the current rank,
and tearing the group down puts that hook back.

The torch calls that differ between the supported releases are made here, typed alike on
each: `new_group` (annotated in torch 2.14, its non-member result a sentinel) and the
collective timeout's setter (public from torch 2.14, which deprecates the private one).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from elasticrun.protocol import SlotInfo

log = logging.getLogger("elasticrun.worker")

_hook_before_groups: Any = None  # sys.excepthook as elasticrun's first group build found it
# An NCCL group was aborted while its work may still have been queued or running: a
# reduction cut midway leaves each rank's tensors as far as it got, so ranks whose commit
# counts agree may still hold different tensors (until the next sync compares them).
_unsettled = False
# Gloo waits up to five times its group's timeout for a peer to connect, and no abort ends
# that wait: a peer lost between publishing its address and connecting held a build for
# 5x the collective timeout. The group connects under a fifth of it (or this floor).
CONNECT_FLOOR_S = 2.0


def connect_timeout(timeout: float) -> float:
    """The timeout a group of collective timeout `timeout` connects under: each peer's
    connection then waits at most `timeout`, as a collective does."""
    return min(timeout, max(CONNECT_FLOOR_S, timeout / 5))


def init_process_group(slot: SlotInfo, store: dist.Store, timeout: float) -> None:
    """Builds the default Gloo group, connected under `connect_timeout(timeout)`, its
    collectives then under `timeout`. A failed build leaves torch's group counter alone."""
    global _hook_before_groups
    if _hook_before_groups is None:
        _hook_before_groups = sys.excepthook
    sys.excepthook = _hook_before_groups  # torch wraps it, with this round's rank
    with group_count_kept():
        dist.init_process_group(backend="gloo", store=store, rank=slot.rank,
                                world_size=slot.size,
                                timeout=datetime.timedelta(seconds=connect_timeout(timeout)))
    set_default_timeout(datetime.timedelta(seconds=timeout))


def set_default_timeout(timeout: datetime.timedelta) -> None:
    """The default group's collectives run under `timeout` from now on: through torch's
    public `set_timeout` where it has one (2.14 on: it deprecates `_set_pg_timeout`, and
    every worker would print the FutureWarning into the job's output), the private setter
    before it."""
    public: Callable[[datetime.timedelta], None] | None = getattr(dist, "set_timeout", None)
    if public is not None:
        public(timeout)
    else:
        dist.distributed_c10d._set_pg_timeout(timeout)


def new_group(ranks: Sequence[int] | None, timeout: datetime.timedelta, *,
              backend: str | None = None,
              pg_options: dist.ProcessGroupNCCL.Options | None = None,
              device_id: torch.device | None = None) -> dist.ProcessGroup | None:
    """`dist.new_group` (collective: every rank of the round calls it, in the same order):
    the group, or None on a rank outside `ranks`, where torch returns its
    GroupMember.NON_GROUP_MEMBER sentinel (which its destroy_process_group ignores)."""
    group = dist.new_group(ranks, timeout=timeout, backend=backend, pg_options=pg_options,
                           device_id=device_id)
    return group if isinstance(group, dist.ProcessGroup) else None


@contextlib.contextmanager
def group_count_kept() -> Iterator[None]:
    """Around building groups: if the build fails, torch's group counter is put back.

    torch names a group's store keys from a process-wide counter, so every member must have
    built (and destroyed) as many groups as the others. Destroying the default group resets
    the counter; a failed attempt has nothing to destroy, so its step is undone (or this
    worker could never meet its peers again: they would wait on other keys)."""
    names_before = group_count()
    try:
        yield
    except BaseException:
        set_group_count(names_before)
        raise


def nccl_options(timeout: float) -> dist.ProcessGroupNCCL.Options:
    """Options of a round's NCCL group: its communicator non-blocking (so that it can be
    aborted safely), its timeout the collective timeout."""
    options = dist.ProcessGroupNCCL.Options()
    options.config.blocking = 0
    options.is_high_priority_stream = False
    options._timeout = datetime.timedelta(seconds=timeout)  # torch warns unless they agree
    return options


def init_nccl_group(device: torch.device | None, timeout: float) -> dist.ProcessGroup:
    """Builds the round's NCCL group over every rank, non-blocking and, with a pinned
    device, connected now rather than at the first collective. A failed build leaves
    torch's group counter alone."""
    options = nccl_options(timeout)
    with group_count_kept():
        group = new_group(None, options._timeout, backend="nccl", pg_options=options,
                          device_id=device)
    assert group is not None
    return group


def abort_nccl(group: dist.ProcessGroup, *, drained: bool = False) -> None:
    """Aborts the group's NCCL communicators: kernels waiting on a dead peer end, and the
    next use of the group raises. Bounded by the group's timeout inside torch. Unless
    `drained` (the device had finished the group's work), the device state is unsettled."""
    global _unsettled
    _unsettled = _unsettled or not drained
    try:
        group._get_backend(torch.device("cuda")).abort()
    except Exception as exc:  # already aborted, or never connected: nothing left to cut
        log.debug("aborting the NCCL group failed: %s", exc)


def take_unsettled() -> bool:
    """Whether an NCCL group was aborted with its work maybe in flight since the last call."""
    global _unsettled
    unsettled, _unsettled = _unsettled, False
    return unsettled


def agree_on_nccl(wants_nccl: bool, wait: Callable[[dist.Work], None]) -> bool:
    """Whether every rank of the just-built Gloo group can use NCCL (one tiny allreduce:
    with --backend auto, a host without GPUs must not leave the others waiting for it),
    waited for by `wait`: the round's abortable wait, as for every other collective (a
    member lost meanwhile can leave Gloo's blocking wait to the collective timeout)."""
    if dist.get_world_size() == 1:
        return wants_nccl
    vote = torch.tensor([1 if wants_nccl else 0], dtype=torch.int32)
    work = dist.all_reduce(vote, op=dist.ReduceOp.MIN, async_op=True)
    assert work is not None
    wait(work)
    return bool(vote.item())


def group_count() -> int | None:
    world = getattr(dist.distributed_c10d, "_world", None)
    return getattr(world, "group_count", None)


def set_group_count(value: int | None) -> None:
    world = getattr(dist.distributed_c10d, "_world", None)
    if value is not None and world is not None and hasattr(world, "group_count"):
        world.group_count = value


def default_group() -> dist.ProcessGroup | None:
    return dist.group.WORLD  # the default group, None before init_process_group


def destroy_process_group() -> None:
    if _hook_before_groups is not None:
        sys.excepthook = _hook_before_groups
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as exc:  # a broken group may fail to tear down; it is abandoned
            log.debug("destroying the process group failed: %s", exc)
