"""The host-change vote carried by a step's gradient reduction.

A commit must tell every rank whether any rank saw a host-change notice, which takes a
collective. Right after an optimizer step one has just run on every rank: the
DistributedOptimizer adds one element to its last bucket, this rank's vote (1 for a notice
seen, else 0), reduced with the gradients by a sum (so, for Average, divided by the size
with them: the result is positive exactly when some rank voted). The commit that follows
reads it instead of starting a collective of its own.

Every rank must take the same path at the same commit. A carried result is used only once,
only in the round that reduced it, and only if no agreement ran since (any agreement
consumes it); `join()` discards it, since a joined rank takes no steps. Under the SPMD rule
(every rank calls step() and commit() in the same order) every rank then holds a fresh
result at exactly the same commits. A notice only ever stays pending until the next round,
so a vote sampled when the last bucket started and read at the commit loses nothing: a
notice that arrives after that is seen by the next commit's vote.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from elasticrun.torch.world import runtime


@dataclass
class _Carried:
    round: int
    result: torch.Tensor  # the reduced vote (in pinned host memory for a CUDA bucket)
    copied: torch.cuda.Event | None = None  # where the copy from the GPU completes


_fresh: _Carried | None = None


def voted() -> bool:
    """This rank's vote: whether it saw a host-change notice the round does not reflect."""
    return runtime.current().hosts_changed()


def carried(reduced: torch.Tensor) -> None:
    """The step's reduction completed: `reduced` is the summed ballot (maybe scaled by a
    positive factor), for the next agreement to use."""
    global _fresh
    round_number = runtime.current().round
    if not reduced.is_cuda:  # a copy: the bucket it rides in is reused by the next step
        _fresh = _Carried(round_number, reduced.clone())
        return
    # Copied now, before the optimizer's kernels are queued, so that the commit waits for
    # the reduction only, not for the update.
    host = torch.empty(1, dtype=reduced.dtype, pin_memory=True)
    host.copy_(reduced, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    _fresh = _Carried(round_number, host, event)


def take() -> Callable[[], bool] | None:
    """The carried agreement (consumed), or None when there is no fresh one."""
    global _fresh
    fresh, _fresh = _fresh, None
    if fresh is None or fresh.round != runtime.current().round:
        return None

    def result() -> bool:
        if fresh.copied is not None:
            fresh.copied.synchronize()
        return bool(fresh.result.item() > 0)

    return result


def discard() -> None:
    """Forgets the carried result: the next agreement starts a collective of its own."""
    global _fresh
    _fresh = None
