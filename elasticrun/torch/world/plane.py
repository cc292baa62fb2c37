"""The data plane: every tensor collective elasticrun issues goes through here, on the
device of its tensors.

CPU tensors travel on the round's Gloo group (the default group). CUDA tensors travel on
the round's NCCL group when it has one (`--backend nccl`, or `auto` on GPUs), with no
host round trip; on a Gloo-only round they are copied to host memory, reduced there and
copied back (`_Staged`), which works for every collective, point-to-point included.
Signatures follow torch.distributed's; with `async_op=True` the result is a Work-like
object (`wait`, `is_completed`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from elasticrun.torch.world import runtime

Work = Any  # a torch Work, or _Staged


def device_group() -> dist.ProcessGroup | None:
    """The round's group for CUDA tensors (None: they go through host memory on Gloo)."""
    session = runtime.current().session
    return None if session is None else session.device_group


def process_group_for(device: torch.device | str = "cuda") -> dist.ProcessGroup:
    """The current round's group for tensors on `device`: hand it to code that calls
    torch.distributed itself, e.g. `DDP(model, process_group=er.process_group_for("cuda"))`
    (a round's groups end with it: build the DDP model again after a reset)."""
    kind = torch.device(device).type
    group = device_group() if kind == "cuda" else None
    if group is None:
        group = dist.group.WORLD  # the default group (torch's public name for it)
    if group is None:
        raise ValueError("Default process group has not been initialized, please make sure "
                         "to call init_process_group.")
    return group


def cuda_device() -> torch.device:
    """This worker's GPU: the one it is pinned to, else CUDA's current device."""
    pinned = runtime.current().device
    return pinned if pinned is not None else torch.device("cuda", torch.cuda.current_device())


class _Abortable:
    """A work of the round's Gloo group: the round's session knows of it (its groups
    outlive it) and waiting for it is released when the round is aborted (works.py)."""

    __slots__ = ("_session", "_work")

    def __init__(self, work: Work) -> None:
        self._work = work
        self._session = runtime.current().session
        if self._session is not None:
            self._session.track(work)

    def is_completed(self) -> bool:
        return bool(self._work.is_completed())

    def wait(self, timeout: Any = None) -> bool:
        if self._session is None:
            self._work.wait()
        else:
            self._session.wait(self._work)
        return True


class _Staged:
    """A collective on host copies of CUDA tensors; waiting copies the results back."""

    def __init__(self, work: Work | None, copy_back: Callable[[], None]) -> None:
        self._work = work
        self._copy_back: Callable[[], None] | None = copy_back

    def is_completed(self) -> bool:
        return self._work is None or self._work.is_completed()

    def wait(self, timeout: Any = None) -> bool:
        if self._work is not None:
            self._work.wait()
            self._work = None
        if self._copy_back is not None:
            copy_back, self._copy_back = self._copy_back, None
            copy_back()
        return True


def _route(tensors: Sequence[torch.Tensor], gloo: dist.ProcessGroup | None
           ) -> tuple[dist.ProcessGroup | None, bool, bool]:
    """(the group to use, whether to stage through host memory, whether it is Gloo's).
    `gloo`: a process set's Gloo group (None: the round's)."""
    if not any(t.is_cuda for t in tensors):
        return gloo, False, True
    device = None if gloo is not None else device_group()
    if device is None:  # a Gloo group: through host memory
        return gloo, True, True
    return device, False, False


def _host(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu")


def _done(work: Work, on_gloo: bool, async_op: bool) -> Work:
    """The work of a collective launched asynchronously: returned, or waited for. Works of
    Gloo groups wait abortably; NCCL's are aborted with the group."""
    if on_gloo:
        work = _Abortable(work)
    if async_op:
        return work
    work.wait()
    return None


def _staged(work: Work, copy_back: Callable[[], None], async_op: bool) -> Work:
    staged = _Staged(_Abortable(work), copy_back)
    if async_op:
        return staged
    staged.wait()
    return None


def _copy_into(targets: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]
               ) -> Callable[[], None]:
    def copy_back() -> None:
        for target, source in zip(targets, sources, strict=True):
            target.copy_(source, non_blocking=False)
    return copy_back


def all_reduce(tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, async_op: bool = False,
               group: dist.ProcessGroup | None = None) -> Work:
    chosen, stage, gloo = _route([tensor], group)
    if not stage:
        return _done(dist.all_reduce(tensor, op=op, group=chosen, async_op=True), gloo,
                     async_op)
    host = _host(tensor)
    work = dist.all_reduce(host, op=op, group=chosen, async_op=True)
    return _staged(work, _copy_into([tensor], [host]), async_op)


def broadcast(tensor: torch.Tensor, src: int, async_op: bool = False,
              group: dist.ProcessGroup | None = None) -> Work:
    """`src`: the root's global rank (as torch's, and Horovod's with process sets)."""
    chosen, stage, gloo = _route([tensor], group)
    if not stage:
        return _done(dist.broadcast(tensor, src=src, group=chosen, async_op=True), gloo,
                     async_op)
    host = _host(tensor)
    work = dist.broadcast(host, src=src, group=chosen, async_op=True)
    return _staged(work, _copy_into([tensor], [host]), async_op)


def all_gather(outputs: list[torch.Tensor], tensor: torch.Tensor, async_op: bool = False,
               group: dist.ProcessGroup | None = None) -> Work:
    chosen, stage, gloo = _route([tensor, *outputs], group)
    if not stage:
        return _done(dist.all_gather(outputs, tensor, group=chosen, async_op=True), gloo,
                     async_op)
    hosts = [torch.empty(t.shape, dtype=t.dtype) for t in outputs]
    work = dist.all_gather(hosts, _host(tensor), group=chosen, async_op=True)
    return _staged(work, _copy_into(outputs, hosts), async_op)


def all_to_all_single(output: torch.Tensor, source: torch.Tensor,
                      output_split_sizes: list[int] | None = None,
                      input_split_sizes: list[int] | None = None,
                      async_op: bool = False, group: dist.ProcessGroup | None = None) -> Work:
    chosen, stage, gloo = _route([output, source], group)
    if not stage:
        return _done(dist.all_to_all_single(output, source,
                                            output_split_sizes=output_split_sizes,
                                            input_split_sizes=input_split_sizes, group=chosen,
                                            async_op=True), gloo, async_op)
    host = torch.empty(output.shape, dtype=output.dtype)
    work = dist.all_to_all_single(host, _host(source), output_split_sizes=output_split_sizes,
                                  input_split_sizes=input_split_sizes, group=chosen,
                                  async_op=True)
    return _staged(work, _copy_into([output], [host]), async_op)


def send(tensor: torch.Tensor, dst: int) -> None:
    # (Gloo's point-to-point works offer no future to wait on abortably.)
    group, stage, _ = _route([tensor], None)
    dist.send(_host(tensor) if stage else tensor, dst=dst, group=group)


def recv(tensor: torch.Tensor, src: int) -> None:
    group, stage, _ = _route([tensor], None)
    if not stage:
        dist.recv(tensor, src=src, group=group)
        return
    host = torch.empty(tensor.shape, dtype=tensor.dtype)
    dist.recv(host, src=src)
    tensor.copy_(host)
