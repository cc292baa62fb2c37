"""Negotiation: before any data moves, the ranks agree on the collective they run.

Each rank encodes its `Request` (requests.py) into a small int64 header; the headers are
combined by an elementwise MAX over the ranks (headers.py: gathered and combined, in small
worlds). Every compared field travels twice, as x and as -x, so the result holds both the
largest and the smallest value each rank sent: equal means every rank agrees. A rank that
called join() sends a neutral value (below any real one) in every compared field and its
join flags in the tail; its peers learn from the same allreduce that it has joined, and what
it must contribute. When the ranks disagree, or one could not start (`error`), all of them
see it in the same result and take the same slow path: they gather every rank's request, and
each raises the same message (CollectiveMismatchError; the rank at fault its own error),
before any data moved, so the next collective works.

DistributedOptimizer announces its step early (`announce_early`, from the step's first
gradient hook), so that the announcement's round trip overlaps the rest of backward; its
data goes out when the buckets are ready. A joined rank treats an early announcement as one
with nothing behind it; if a rank has joined, the training ranks announce again, at once,
before the data. Any other negotiation on this rank first settles a pending early one, so
every rank's headers stay in the same order.

An allreduce describes its data collectives as buckets. A rank that joined serves a single
bucket from the header alone; several (DistributedOptimizer's step) it looks up by the
layout's key, in a registry every rank keeps alike for the round: the first time a round
sees a layout, the lowest training rank broadcasts it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from elasticrun.torch.collectives import deferral, gathered
from elasticrun.torch.collectives.headers import (
    ERROR,
    GATHER_UP_TO,
    JOINED,
    LAST_JOINER,
    LOWEST_TRAINING,
    TRAINING,
    UNKNOWN,
    Combining,
    agreed,
    encode,
    exchange,
    make_header,
)
from elasticrun.torch.collectives.requests import (
    DTYPES,
    OPS,
    SERVED_WHILE_JOINED,
    Bucket,
    CollectiveMismatchError,
    Kind,
    Request,
)
from elasticrun.torch.world import runtime
from elasticrun.torch.world.place import Scope


@dataclass(frozen=True)
class Agreement:
    """What the ranks agreed on (`kind` None: every active rank has joined) and who joined."""

    kind: Kind | None
    numel: int = 0  # of the first bucket (an allreduce)
    dtype: torch.dtype | None = None  # the first bucket's
    device: str = "CPU"
    buckets: tuple[Bucket, ...] = ()  # every bucket of an allreduce
    op: str = ""
    joined: bool = False  # some rank has joined
    all_joined: bool = False
    last_joiner: int = -1
    failed: str = ""  # the ranks disagreed (a joined rank learns it, and goes on)
    early: bool = False  # an early announcement: its data comes later, announced again


def _training_header(request: Request, local_error: BaseException | None,
                     rank: int | None = None) -> torch.Tensor:
    """The header of `request` (a new tensor: an allreduce changes it in place). `rank`: in
    a process set, this rank's place in it."""
    unknown = len(request.buckets) > 1 and request.layout_key() not in gathered.registry()
    return make_header(encode(request),
                       rank=runtime.current().slot.rank if rank is None else rank,
                       joining=False, error=local_error is not None, unknown=unknown)


_headers: dict[tuple[Request, int, int], torch.Tensor] = {}  # (request, round, rank)


def _repeated_header(request: Request) -> torch.Tensor:
    """The header of a request sent again and again (DistributedOptimizer's step), made
    once a round: gathering leaves it as it was (in large worlds, a copy is combined)."""
    live = runtime.current()
    key = (request, live.round, live.slot.rank)
    header = _headers.get(key)
    if header is None or len(request.buckets) > 1 and \
            request.layout_key() not in gathered.registry():  # until the layout is shared
        if len(_headers) > 64:
            _headers.clear()
        header = _headers[key] = _training_header(request, None)
    return header if live.slot.size <= GATHER_UP_TO else header.clone()


def _decided(request: Request, values: list[int], local_error: BaseException | None,
             scope: Scope | None = None) -> Agreement:
    """A training rank's reading of the combined headers (raising, on every rank alike, when
    they disagree)."""
    same, _ = agreed(values)
    joined = values[JOINED] == 1
    if not same or values[ERROR] or (joined and request.kind not in SERVED_WHILE_JOINED):
        message = gathered.slow_path(request, scope)
        if local_error is not None:
            raise local_error
        raise CollectiveMismatchError(message or "the ranks disagreed on this collective")
    if values[UNKNOWN]:
        gathered.share_layout(request.buckets, -values[LOWEST_TRAINING])
    return Agreement(request.kind, *_first(request.buckets), request.device, request.buckets,
                     request.op, joined=joined, last_joiner=values[LAST_JOINER],
                     early=request.early)


def negotiate(request: Request, local_error: BaseException | None = None,
              scope: Scope | None = None) -> Agreement:
    """A training rank's side. Returns once every rank (of `scope`, a process set's; None:
    the round's) agreed; raises, on every rank alike, when they did not, or when a rank has
    joined and `request.kind` cannot run then. `local_error`: why this rank cannot run it
    (raised here, after the others were told)."""
    agreement = negotiate_named(request, local_error, scope)
    assert agreement is not None  # (only a deferrable collective is left waiting)
    return agreement


_count = 0  # negotiations so far in this process


def count() -> int:
    """How many negotiations this process started (handles.py frees a completed
    collective's name once another one started after it)."""
    return _count


def negotiate_named(request: Request, local_error: BaseException | None = None,
                    scope: Scope | None = None, deferrable: bool = False,
                    wanted: str | None = None) -> Agreement | None:
    """negotiate(), where the ranks on different collectives match named asynchronous ones
    by name (deferral.py). `deferrable`: this is one (None is returned when it is left
    waiting); `wanted`: this rank synchronizes the waiting one of that name, whose request
    `request` is (it has started when this returns)."""
    global _count
    _count += 1
    size = runtime.current().slot.size if scope is None else scope.size
    if size == 1:
        if local_error is not None:
            raise local_error
        if wanted is not None:
            deferral.queue.start(wanted)
        return Agreement(request.kind, *_first(request.buckets), request.device,
                         request.buckets, request.op)
    settle_early()
    if scope is not None and scope.group is not None:  # a process set: no joins, no layouts
        header = make_header(encode(request), rank=scope.rank, joining=False,
                             error=local_error is not None, unknown=False)
        return _decided(request, exchange(header, size, scope.group), local_error, scope)
    while True:
        values = exchange(_training_header(request, local_error), size)
        same, _ = agreed(values)
        if same or values[ERROR] or values[JOINED] == 1 or local_error is not None:
            agreement = _decided(request, values, local_error)
            if wanted is not None:
                deferral.queue.start(wanted)
            return agreement
        views = gathered.gather_objects(deferral.View(request, deferrable,
                                                      deferral.queue.requests(), wanted))
        decision = deferral.decide([v if isinstance(v, deferral.View) else deferral.View(None)
                                    for v in views], runtime.current().slot.rank)
        if decision.error is not None:
            if decision.drop is not None:  # its handle raises the same error
                deferral.queue.fail(decision.drop, decision.error)
            raise CollectiveMismatchError(decision.error)
        if decision.start is not None:
            deferral.queue.start(decision.start)
        if decision.outcome is deferral.Outcome.DEFER:
            return None
        if decision.outcome is deferral.Outcome.PROCEED or \
                (wanted is not None and wanted not in deferral.queue.items):
            return Agreement(request.kind, *_first(request.buckets), request.device,
                             request.buckets, request.op, early=request.early)


class Early:
    """An announcement in flight ahead of its data (announce_early)."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.round = runtime.current().round
        self._combining = Combining(_repeated_header(request), runtime.current().slot.size)
        self._agreement: Agreement | None = None

    def result(self) -> Agreement:
        """What the ranks agreed (raising as negotiate() does), once."""
        global _early
        if _early is self:
            _early = None
        if self._agreement is None:
            self._agreement = _decided(self.request, self._combining.result(), None)
        return self._agreement


_early: Early | None = None


def announce_early(request: Request) -> Early:
    """Starts the negotiation of `request` (early=True) now; its result is read later."""
    global _early
    settle_early()
    _early = Early(request)
    return _early


def settle_early() -> None:
    """Reads a pending early announcement's result: before any other negotiation, so that
    headers pair up in the same order on every rank."""
    global _early
    early, _early = _early, None
    if early is not None and early.round == runtime.current().round:
        early.result()  # (one of an earlier round is gone with that round's group)


def drop_early(early: Early | None) -> None:
    """Forgets `early` if it is still pending (its round is gone, or its step failed)."""
    global _early
    if early is not None and _early is early:
        _early = None


def negotiate_joined(joining: bool) -> Agreement:
    """A joined rank's side (join.py): what the training ranks are about to run, and what
    to contribute to it. `joining`: this is the rank's first header since it joined."""
    slot = runtime.current().slot
    values = exchange(make_header((), rank=slot.rank, joining=joining, error=False,
                                  unknown=False), slot.size)
    if values[TRAINING] == 0:
        return Agreement(None, joined=True, all_joined=True, last_joiner=values[LAST_JOINER])
    same, fields = agreed(values)
    kind = Kind(fields[0])
    if not same or values[ERROR] or kind not in SERVED_WHILE_JOINED:
        return Agreement(kind, joined=True, failed=gathered.slow_path(None) or "disagreed")
    count, layout = fields[10], fields[11]
    if values[UNKNOWN]:
        buckets = gathered.share_layout((), -values[LOWEST_TRAINING])
    elif count > 1:
        buckets = gathered.registry()[layout]
    else:
        buckets = ((fields[8], DTYPES[fields[9] - 1]),) if count else ()
    if fields[12] == 1:  # an early announcement: the data follows a second one
        return Agreement(kind, joined=True, early=True, last_joiner=values[LAST_JOINER])
    return Agreement(kind, *_first(buckets), "GPU" if fields[2] else "CPU", buckets,
                     OPS[fields[3]], joined=True, last_joiner=values[LAST_JOINER])


def _first(buckets: tuple[Bucket, ...]) -> tuple[int, torch.dtype | None]:
    return buckets[0] if buckets else (0, None)
