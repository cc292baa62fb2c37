"""What a rank is about to do in a collective, and what ranks that disagree are told.

Every collective elasticrun issues is negotiated first (negotiation.py): each rank describes
the collective it is about to run as a `Request`, the ranks compare their requests, and data
moves only when they agree, as with Horovod's coordinator. This module is the pure part:
the request, the kinds with Horovod's names for them, and the message for a disagreement,
worded as Horovod's coordinator words it (horovod/common/controller.cc), with the ranks
behind each value.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.distributed

from elasticrun.worker.elastic import CollectiveMismatchError  # noqa: F401 - re-exported


class Kind(enum.IntEnum):
    ALLREDUCE = 1
    BROADCAST = 2
    ALLGATHER = 3
    ALLTOALL = 4
    REDUCESCATTER = 5
    BARRIER = 6
    ADASUM = 7
    OBJECT = 8


# A rank that called join() serves these; the others fail while a rank has joined.
SERVED_WHILE_JOINED = frozenset({Kind.ALLREDUCE, Kind.BARRIER})
NOT_WITH_JOIN = {
    Kind.BROADCAST: "Broadcast is not supported with Join at this time.",
    Kind.ALLGATHER: "Allgather is not supported with Join at this time.",
    Kind.ALLTOALL: "Alltoall is not supported with Join at this time.",
    Kind.REDUCESCATTER: "Reducescatter is not supported with Join at this time.",
    Kind.ADASUM: "Adasum is not supported with Join at this time.",
    Kind.OBJECT: "Object collectives (broadcast_object, allgather_object) are not supported "
                 "with Join at this time.",
}
DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.bool, torch.complex64,
          torch.complex128)

# Reduce ops by name (ReduceOp's values), and what each is on the wire.
OPS = ("", "average", "sum", "min", "max", "product", "adasum")
WIRE_OPS = {"average": torch.distributed.ReduceOp.SUM, "sum": torch.distributed.ReduceOp.SUM,
            "min": torch.distributed.ReduceOp.MIN, "max": torch.distributed.ReduceOp.MAX,
            "product": torch.distributed.ReduceOp.PRODUCT}

Shape = tuple[int, ...]
Bucket = tuple[int, torch.dtype]  # what one data collective of an allreduce carries


@dataclass(frozen=True)
class Request:
    """One rank's collective, as the ranks compare it. `dtypes` and `shapes`: one per tensor
    (for a grouped collective, several); allgather and alltoall compare all but the first
    dimension. `buckets`: what an allreduce's data collectives carry, in order (a rank
    that called join() contributes zeros of these). `error`: why this rank cannot run it
    (every rank then raises)."""

    kind: Kind
    dtypes: tuple[torch.dtype, ...] = ()  # one per tensor
    shapes: tuple[Shape, ...] = ()
    device: str = "CPU"  # or "GPU"
    op: str = ""  # the reduce op (allreduce, reducescatter)
    root: int = -1  # broadcast
    scales: tuple[float, float] = (1.0, 1.0)  # prescale, postscale
    name: str | None = None
    buckets: tuple[Bucket, ...] = ()
    error: str = ""
    early: bool = False  # announced ahead of its data (negotiation.announce_early)

    def compared_shapes(self) -> tuple[Shape, ...]:
        if self.kind in (Kind.ALLGATHER, Kind.ALLTOALL):
            return tuple(shape[1:] for shape in self.shapes)
        return self.shapes

    def layout_key(self) -> int:
        """The buckets' identity: a rank that joined looks the layout up by it."""
        return stable_hash(repr([(n, dtype_name(d)) for n, d in self.buckets]))


def stable_hash(text: str) -> int:
    """The same non-negative 61-bit number on every rank and in every process."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 3


def dtype_name(dtype: torch.dtype | None) -> str:
    return "none" if dtype is None else str(dtype).removeprefix("torch.")


def _dtypes_text(dtypes: tuple[torch.dtype, ...]) -> str:
    names = [dtype_name(d) for d in dtypes]
    return names[0] if len(set(names)) == 1 else "(" + ", ".join(names) + ")"


def _shape_text(shapes: tuple[Shape, ...]) -> str:
    texts = [str(list(shape)) for shape in shapes]
    return texts[0] if len(texts) == 1 else "(" + ", ".join(texts) + ")"


def _who(values: Mapping[int, str]) -> str:
    """`rank 0: x, rank 1: y` for a few ranks; grouped by value (at most 4, each naming at
    most 8 ranks) for many."""
    if len(values) <= 8:
        return ", ".join(f"rank {rank}: {value}" for rank, value in sorted(values.items()))
    by_value: dict[str, list[int]] = {}
    for rank, value in sorted(values.items()):
        by_value.setdefault(value, []).append(rank)
    parts = []
    for value, ranks in list(by_value.items())[:4]:
        named = ", ".join(str(r) for r in ranks[:8]) + (", ..." if len(ranks) > 8 else "")
        parts.append(f"rank{'s' if len(ranks) > 1 else ''} {named}: {value}")
    return "; ".join(parts)


def _first_two(values: Mapping[int, str]) -> tuple[str, str]:
    ordered = [values[r] for r in sorted(values)]
    first = ordered[0]
    return first, next(v for v in ordered if v != first)


def mismatch(requests: Mapping[int, Request | None], joined: int = 0) -> str | None:
    """The message for the first way in which the ranks' requests differ (None: they
    agree). `requests[rank]` is None for a rank that called join(); `joined` is how many
    have."""
    active = {rank: r for rank, r in requests.items() if r is not None}
    if not active:
        return None
    errors = {rank: r.error for rank, r in active.items() if r.error}
    if errors:
        return f"the collective could not start on every rank ({_who(errors)})"
    kind = next(iter(active.values())).kind
    for what, values in _checks(active):
        if len(set(values.values())) > 1:
            return _worded(what, kind.name, values)
    if joined and kind in NOT_WITH_JOIN:
        return NOT_WITH_JOIN[kind]
    return None


def _checks(active: Mapping[int, Request]) -> Iterator[tuple[str, dict[int, str]]]:
    """What the ranks compare, in order, each computed only once the ones before agreed: a
    later check may rely on an earlier (the first dimension on the operations and counts)."""
    yield "operations", {k: r.kind.name for k, r in active.items()}
    yield "tensor counts", {k: str(len(r.shapes)) for k, r in active.items()}
    yield "data types", {k: _dtypes_text(r.dtypes) for k, r in active.items()}
    yield "tensor ranks", {k: ", ".join(str(len(s)) for s in r.shapes) for k, r in active.items()}
    yield "dimensions", _first_dimension(active)
    yield "tensor shapes", {k: _shape_text(r.compared_shapes()) for k, r in active.items()}
    yield "prescale and/or postscale factors", {k: str(r.scales) for k, r in active.items()}
    yield "reduction operation", {k: r.op for k, r in active.items()}
    yield "root ranks", {k: str(r.root) for k, r in active.items()}
    yield "CPU/GPU device selection", {k: r.device for k, r in active.items()}
    yield "names", {k: repr(r.name) for k, r in active.items() if r.name is not None}
    yield "announcements", {k: "early" if r.early else "at once" for k, r in active.items()}


def _first_dimension(active: Mapping[int, Request]) -> dict[int, str]:
    """For allgather and alltoall: the first dimension (past the first) in which the ranks'
    shapes differ, as `d=value` (Horovod names it). Empty when none does."""
    first = next(iter(active.values()))
    if first.kind not in (Kind.ALLGATHER, Kind.ALLTOALL) or len(first.shapes) != 1 or \
            len({len(r.shapes[0]) for r in active.values() if r.shapes}) != 1:
        return {}
    for dim in range(1, len(first.shapes[0])):
        sizes = {k: r.shapes[0][dim] for k, r in active.items()}
        if len(set(sizes.values())) > 1:
            return {k: f"{size} (dimension {dim})" for k, size in sizes.items()}
    return {}


def _dimension_words(label: str, one: str, other: str) -> str:
    """Horovod's words for an allgather's dimension: from `SIZE (dimension D)` values."""
    (size_one, dim), size_other = one[:-1].split(" (dimension "), other.split(" ")[0]
    return (f"Mismatched {label} tensor shapes: One rank sent a tensor with dimension {dim} "
            f"equal to {size_one}, but another rank sent a tensor with dimension {dim} equal "
            f"to {size_other}.")


def _worded(what: str, label: str, values: Mapping[int, str]) -> str:
    one, other = _first_two(values)
    if what == "dimensions":
        return f"{_dimension_words(label, one, other)} ({_who(values)})"
    said = {
        "operations": f"Mismatched operations: One rank did an {one}, but another rank did "
                      f"an {other}.",
        "data types": f"Mismatched data types: One rank had type {one}, but another rank had "
                      f"type {other}.",
        "tensor counts": f"Mismatched {label} tensor counts: One rank sent {one} tensor(s), but "
                         f"another rank sent {other}.",
        "tensor ranks": f"Mismatched {label} tensor shapes: One rank sent a tensor of rank "
                        f"{one}, but another rank sent a tensor of rank {other}.",
        "tensor shapes": f"Mismatched {label} tensor shapes: One rank sent a tensor of shape "
                         f"{one}, but another rank sent a tensor of shape {other}.",
        "prescale and/or postscale factors": f"Mismatched prescale and/or postscale factors: "
                                             f"One rank sent factors {one}, but another rank "
                                             f"sent factors {other}.",
        "reduction operation": f"Mismatched reduction operation: One rank sent reduction op "
                               f"{one}, but another rank sent reduction op {other}.",
        "root ranks": f"Mismatched {label} root ranks: One rank specified root rank {one}, but "
                      f"another rank specified root rank {other}.",
        "CPU/GPU device selection": f"Mismatched {label} CPU/GPU device selection: One rank "
                                    f"specified device {one}, but another rank specified "
                                    f"device {other}.",
        "names": f"Mismatched {label} names: One rank named it {one}, but another rank named "
                 f"it {other}.",
        "announcements": f"Mismatched {label} announcements: One rank announced it {one}, "
                         f"but another rank {other} (DistributedOptimizer's overlap setting "
                         f"differs between ranks?).",
    }[what]
    return f"{said} ({_who(values)})"
