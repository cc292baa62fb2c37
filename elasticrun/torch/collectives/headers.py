"""A negotiation's header: a rank's request as a small int64 tensor, and the elementwise MAX
that combines every rank's header into one.

Every compared field travels twice, as x and as -x, so that the combined header holds both
the largest and the smallest value the ranks sent: equal means every rank agrees. A joined
rank sends a neutral value (below any real one) in every compared field, and its join flags
in the tail. Small worlds gather the headers and combine them here; larger ones allreduce.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from elasticrun.torch.collectives.requests import DTYPES, OPS, Request, stable_hash
from elasticrun.torch.world import plane
from elasticrun.torch.world.boundary import collective

NEUTRAL = -(1 << 62)  # below every encoded value and its negation (those are under 2**61)
CHECKED = 13  # kind, dtype, device, op, root, shapes, scales, name, numel, bucket dtype,
#               buckets, layout, early
_TAIL = 6  # joined, training, last joiner, -(lowest training rank), error, layout unknown
JOINED, TRAINING, LAST_JOINER, LOWEST_TRAINING, ERROR, UNKNOWN = range(2 * CHECKED,
                                                                       2 * CHECKED + _TAIL)


def _code(dtype: torch.dtype | None) -> int:
    return DTYPES.index(dtype) + 1 if dtype in DTYPES else 0


@functools.lru_cache(maxsize=256)
def encode(request: Request) -> tuple[int, ...]:
    """The compared fields of a request (cached: a step's request is the same each step)."""
    first_numel, first_dtype = request.buckets[0] if request.buckets else (0, None)
    fields = (int(request.kind), stable_hash(repr(request.dtypes)),
              int(request.device == "GPU"),
              OPS.index(request.op), request.root + 1,
              stable_hash(repr(request.compared_shapes())), stable_hash(repr(request.scales)),
              NEUTRAL if request.name is None else stable_hash(request.name),
              first_numel, _code(first_dtype), len(request.buckets),
              request.layout_key() if len(request.buckets) > 1 else 0, int(request.early))
    negated = tuple(NEUTRAL if f == NEUTRAL else -f for f in fields)
    return fields + negated


def make_header(compared: tuple[int, ...], *, rank: int, joining: bool, error: bool,
                unknown: bool) -> torch.Tensor:
    if compared:  # a training rank
        tail = (0, 1, -1, -rank, int(error), int(unknown))
    else:  # a joined rank: neutral everywhere it compares
        compared = (NEUTRAL,) * (2 * CHECKED)
        tail = (1, 0, rank if joining else -1, NEUTRAL, 0, 0)
    return torch.tensor(compared + tail, dtype=torch.int64)


# Up to this many ranks the headers are gathered and combined here: for a few hundred bytes
# Gloo's ring allreduce costs about three times the CPU of an allgather (2 ranks on 2 cores:
# 1.2 ms against 0.4 ms a header), which takes half the steps around the ring.
GATHER_UP_TO = 64


class Combining:
    """The elementwise MAX over ranks (of `group`: None for the round's) of a header."""

    def __init__(self, header: torch.Tensor, size: int,
                 group: dist.ProcessGroup | None = None) -> None:
        self._header = header
        self._parts = ([torch.empty_like(header) for _ in range(size)]
                       if size <= GATHER_UP_TO else None)
        with collective("negotiating a collective"):
            if self._parts is not None:
                self._work = plane.all_gather(self._parts, header, async_op=True, group=group)
            else:
                self._work = plane.all_reduce(header, op=dist.ReduceOp.MAX, async_op=True,
                                              group=group)

    def result(self) -> list[int]:
        with collective("negotiating a collective"):
            self._work.wait()
        if self._parts is None:
            return self._header.tolist()
        values: list[int] = torch.stack(self._parts).amax(dim=0).tolist()
        return values


def exchange(header: torch.Tensor, size: int, group: dist.ProcessGroup | None = None
             ) -> list[int]:
    return Combining(header, size, group).result()


def agreed(values: list[int]) -> tuple[bool, list[int]]:
    """(whether every training rank sent the same compared fields, those fields)."""
    hi, negated = values[:CHECKED], values[CHECKED:2 * CHECKED]
    same = all(h == (NEUTRAL if n == NEUTRAL else -n) for h, n in zip(hi, negated, strict=True))
    return same, hi
