"""What the ranks learn from one another by gathering small objects, off the fast path:
every rank's request when a negotiation finds that they disagree (for the message each rank
raises), and the bucket layouts of DistributedOptimizer's steps, learned once per round so
that a joined rank can serve a step of several buckets from its header alone."""

from __future__ import annotations

import pickle

import torch

from elasticrun.torch.collectives.requests import Bucket, Kind, Request, mismatch
from elasticrun.torch.world import plane, runtime
from elasticrun.torch.world.boundary import collective
from elasticrun.torch.world.place import Scope


# --- the slow path: every rank's request, for the message ----------------------------------
def slow_path(request: Request | None, scope: Scope | None = None) -> str | None:
    """Every rank's request (None from joined ranks) gathered, and the message for how they
    differ. Every rank runs this after the same header, so it pairs up."""
    requests: dict[int, Request | None] = {
        rank: r if isinstance(r, Request) else None
        for rank, r in enumerate(gather_objects(request, scope))}
    joined = sum(1 for r in requests.values() if r is None)
    return mismatch(requests, joined)


def gather_objects(obj: object, scope: Scope | None = None) -> list[object]:
    """Every rank's `obj` (of `scope`), pickled, in rank order (two gathers: the lengths,
    then the bytes). Only for elasticrun's own objects (requests, layouts)."""
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    size = runtime.current().slot.size if scope is None else scope.size
    group = None if scope is None else scope.group
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
    with collective("negotiating a collective"):
        plane.all_gather(lengths, torch.tensor([data.numel()], dtype=torch.int64), group=group)
        longest = max(int(n.item()) for n in lengths)
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[:data.numel()] = data
        parts = [torch.empty(longest, dtype=torch.uint8) for _ in range(size)]
        plane.all_gather(parts, padded, group=group)
    return [pickle.loads(part[:int(n.item())].numpy().tobytes())  # noqa: S301 - our own
            for part, n in zip(parts, lengths, strict=True)]


# --- layouts of several buckets, learned once per round ------------------------------------
_layouts: dict[int, tuple[Bucket, ...]] = {}
_layouts_round = -1


def registry() -> dict[int, tuple[Bucket, ...]]:
    global _layouts_round
    number = runtime.current().round
    if number != _layouts_round:
        _layouts.clear()
        _layouts_round = number
    return _layouts


def share_layout(buckets: tuple[Bucket, ...], root: int) -> tuple[Bucket, ...]:
    """The lowest training rank's buckets, to every rank; each registers them."""
    shared = gather_objects(buckets if runtime.current().slot.rank == root else None)[root]
    assert isinstance(shared, tuple)
    layout: tuple[Bucket, ...] = shared
    registry()[Request(Kind.ALLREDUCE, buckets=layout).layout_key()] = layout
    return layout
