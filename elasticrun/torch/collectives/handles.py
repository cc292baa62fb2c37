"""Handles of asynchronous collectives: `poll(handle)` and `synchronize(handle)`, as Horovod.

An async collective launches its Gloo works at once and returns an int handle; the works
run in the background; `synchronize` waits for them (turning a failed peer into
WorkersFailedError) and returns the result, which `finish` computes from the completed
buffers (a division for Average, a copy back for in-place variants, a decompression).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from elasticrun.torch.collectives import deferral
from elasticrun.torch.collectives.fusion import Waitable
from elasticrun.torch.collectives.negotiation import count as negotiation_count
from elasticrun.torch.collectives.negotiation import negotiate_named
from elasticrun.torch.collectives.requests import CollectiveMismatchError, Request
from elasticrun.torch.world import runtime
from elasticrun.torch.world.boundary import collective
from elasticrun.torch.world.place import Scope
from elasticrun.worker import timeline


@dataclass
class Pending:
    what: str
    works: list[Waitable]
    finish: Callable[[], Any]
    nbytes: int = 0
    op: str = ""
    name: str | None = None  # the user's name: one collective of a name in flight at a time
    launched: float = field(default_factory=time.time)
    round: int = field(default_factory=lambda: _round())
    # Left waiting for the other ranks to submit its name (deferral.py): its request, and
    # why it will never run, once that is known.
    waiting: Request | None = None
    failure: str | None = None
    first: bool = False  # the result is the first of the list `finish` returns
    # Negotiations started when it launched: once another one has started and it has
    # completed, its name is free again (Horovod frees a name when its collective is done).
    seen: int = field(default_factory=lambda: negotiation_count())

    def result(self) -> Any:
        result = self.finish()
        return result[0] if self.first else result

    def completed(self) -> bool:
        return self.waiting is None and all(work.is_completed() for work in self.works)

    def wait(self) -> Any:
        if self.waiting is not None and self.failure is None and self.round == _round():
            negotiate_named(self.waiting, wanted=self.name)  # it has started on return
        if self.failure is not None:
            raise CollectiveMismatchError(self.failure)
        waited = time.time()
        with collective(self.what):
            for work in self.works:
                work.wait()
        result = self.result()
        if timeline.enabled():
            timeline.record(self.what, "collective", self.launched, time.time(),
                            bytes=self.nbytes, op=self.op,
                            queue_ms=round((waited - self.launched) * 1e3, 3))
        return result


_pending: dict[int, Pending] = {}
_names: dict[str, int] = {}  # names in flight -> their handle
_numbers = itertools.count(1)

DUPLICATE_NAME = ("Requested to allreduce, allgather, or broadcast a tensor with the same name "
                  "as another tensor that is currently being processed. If you want to request "
                  "another tensor, use a different tensor name.")


def _round() -> int:
    return runtime.current().round if runtime.is_initialized() else -1


def name_problem(name: str | None) -> ValueError | None:
    """Horovod's error for a name whose collective is still in flight (None: free). A name
    whose collective was left in an earlier round is free again (that round's works are
    gone with it)."""
    if name is None or name not in _names:
        return None
    handle = _names[name]
    pending = _pending.get(handle)
    if pending is None or pending.round != _round():
        del _names[name]
        _pending.pop(handle, None)
        return None
    if negotiation_count() > pending.seen and pending.completed():
        del _names[name]  # done (its handle still gives the result)
        return None
    return ValueError(f"{DUPLICATE_NAME} (name {name!r})")


def submit(request: Request, problem: BaseException | None, within: Scope | None,
           launch: Callable[[], Pending], deferrable: bool = False) -> Pending:
    """Negotiates `request`, then launches its data (`launch`). `deferrable`: a named
    asynchronous collective of the whole round, which may be left waiting until every rank
    has submitted its name (deferral.py); its duplicate name is then refused at once, here,
    as Horovod refuses it, without a word to the other ranks."""
    deferrable = deferrable and request.name is not None \
        and (within is None or within.group is None)
    if deferrable and problem is not None and isinstance(problem, ValueError) \
            and problem.args and str(problem.args[0]).startswith(DUPLICATE_NAME):
        raise problem
    agreement = negotiate_named(request, problem, within, deferrable)
    if agreement is not None:
        return launch()
    pending = Pending(f"{request.kind.name.lower()} {request.name}", [], lambda: None,
                      name=request.name, waiting=request)

    def start() -> None:
        launched = launch()
        pending.works, pending.finish, pending.nbytes = \
            launched.works, launched.finish, launched.nbytes
        pending.op, pending.launched, pending.waiting = launched.op, launched.launched, None
        pending.seen = negotiation_count()

    def fail(message: str) -> None:
        pending.failure = message

    deferral.queue.add(request, start, fail)
    return pending


def first_of(pending: Pending) -> Pending:
    """`pending`, whose result is the first of the tensors it reduces."""
    pending.first = True
    return pending


def register(pending: Pending) -> int:
    handle = next(_numbers)
    _pending[handle] = pending
    if pending.name is not None:
        _names[pending.name] = handle
    return handle


def poll(handle: int) -> bool:
    """True once the collective behind `handle` has completed (synchronize will not block)."""
    pending = _pending.get(handle)
    if pending is None:
        raise ValueError(f"poll({handle!r}): no such handle (already synchronized?)")
    with collective(pending.what):
        return pending.completed()


def synchronize(handle: int) -> Any:
    """Waits for the collective behind `handle` and returns its result (None for a handle
    that is not pending, as with Horovod)."""
    pending = _pending.pop(handle, None)
    if pending is None:
        return None
    if pending.name is not None and _names.get(pending.name) == handle:
        del _names[pending.name]
    return pending.wait()


def forget_all() -> None:
    """Drops every pending handle (a reset: their round's works are gone)."""
    _pending.clear()
    _names.clear()
    deferral.queue.clear()
