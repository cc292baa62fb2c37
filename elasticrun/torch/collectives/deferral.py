"""Asynchronous collectives matched by name, as Horovod's coordinator matches them.

The ranks negotiate every collective in program order (negotiation.py): that is the fast
path, and it stays so. A named asynchronous collective (`allreduce_async(t, name="x")`) may
be submitted in another order on another rank; Horovod runs it once every rank has
submitted that name, and collectives of other names complete meanwhile. Here that happens
when a negotiation finds the ranks on different collectives: every rank then tells the
others (one gather, off the fast path) what it is on and which named asynchronous ones it
has waiting, and each applies the same rule (`decide`):

1. a name that every rank has submitted (the collective it is on, or one waiting) runs now
   on every rank: the first in rank order, then the order each rank submitted them; the
   ranks that had it waiting start it and negotiate their own collective again;
2. else a rank on a named asynchronous collective leaves it waiting (its handle returns at
   once, the collective starts once the others submit it) and the other ranks negotiate
   again, meeting that rank at its next collective;
3. else nothing can progress: the ranks are on different blocking collectives, or wait
   (`synchronize`) for names that others never submit before theirs; every rank raises
   the same CollectiveMismatchError, naming each rank's collective.

A waiting collective whose requests differ between ranks (the same name, another shape or
dtype) raises on every rank when it comes to run. Blocking collectives keep their
program-order check; so do unnamed asynchronous ones (Horovod names them by a per-rank
counter: program order too). `poll()` does not make a waiting collective progress: the
next collective or `synchronize()` on a rank does.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from elasticrun.torch.collectives.requests import Request, mismatch


class Outcome(enum.Enum):
    PROCEED = "proceed"  # run the collective this rank is on
    RETRY = "retry"  # negotiate this rank's collective again
    DEFER = "defer"  # leave this rank's collective waiting


@dataclass(frozen=True)
class View:
    """What one rank tells the others: the collective it is on (`current`, None for a
    joined rank), whether it may wait, and the named ones waiting, in submission order.
    `wanted`: the name whose waiting collective this rank's synchronize() needs."""

    current: Request | None
    deferrable: bool = False
    waiting: tuple[Request, ...] = ()
    wanted: str | None = None


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    start: str | None = None  # a waiting collective this rank starts first
    error: str | None = None  # every rank raises this
    drop: str | None = None  # the waiting collective the error is about (it fails too)


def _submitted(view: View) -> dict[str, Request]:
    named = {r.name: r for r in view.waiting if r.name is not None}
    if view.deferrable and view.current is not None and view.current.name is not None:
        named.setdefault(view.current.name, view.current)
    return named


def decide(views: list[View], rank: int) -> Decision:
    """The same rule on every rank, from every rank's view (see the module's docstring)."""
    if any(view.current is None for view in views):
        return Decision(Outcome.PROCEED, error=mismatch(
            {r: v.current for r, v in enumerate(views)},
            sum(1 for v in views if v.current is None)) or "the ranks disagreed")
    submitted = [_submitted(view) for view in views]
    for candidate in _in_order(views):
        if all(candidate in names for names in submitted):
            requests = {r: _as_run(names[candidate]) for r, names in enumerate(submitted)}
            problem = mismatch(requests)
            if problem is not None:
                return Decision(Outcome.PROCEED, error=problem, drop=candidate)
            mine = views[rank]
            on_it = mine.deferrable and mine.current is not None \
                and mine.current.name == candidate and candidate not in \
                {r.name for r in mine.waiting}
            return Decision(Outcome.PROCEED) if on_it else Decision(Outcome.RETRY, candidate)
    if any(view.deferrable for view in views):
        return Decision(Outcome.DEFER if views[rank].deferrable else Outcome.RETRY)
    if not any(view.wanted for view in views):  # program order, as ever
        return Decision(Outcome.PROCEED, error=mismatch(
            {r: v.current for r, v in enumerate(views)}) or "the ranks disagreed")
    return Decision(Outcome.PROCEED, error=_deadlock(views))


def _as_run(request: Request) -> Request:
    return replace(request, early=False, error="")


def _in_order(views: list[View]) -> list[str]:
    seen: list[str] = []
    for view in views:
        for name in [*(r.name for r in view.waiting),
                     view.current.name if view.deferrable and view.current else None]:
            if name is not None and name not in seen:
                seen.append(name)
    return seen


def _deadlock(views: list[View]) -> str:
    parts = []
    for rank, view in enumerate(views):
        if view.wanted is not None:
            parts.append(f"rank {rank} waits for {view.wanted!r}")
        elif view.current is not None:
            name = f" {view.current.name!r}" if view.current.name else ""
            parts.append(f"rank {rank} is in {view.current.kind.name.lower()}{name}")
    return ("the ranks wait on one another: " + "; ".join(parts) + " (a named asynchronous "
            "collective runs once every rank has submitted it)")


# --- this rank's waiting collectives ---------------------------------------------------------
@dataclass
class Waiting:
    request: Request
    start: Callable[[], None]  # launches it (its negotiation is done)
    fail: Callable[[str], None]  # its handle raises CollectiveMismatchError(message)


@dataclass
class Queue:
    items: dict[str, Waiting] = field(default_factory=dict)  # by name, in submission order

    def requests(self) -> tuple[Request, ...]:
        return tuple(item.request for item in self.items.values())

    def add(self, request: Request, start: Callable[[], None],
            fail: Callable[[str], None]) -> None:
        assert request.name is not None
        self.items[request.name] = Waiting(request, start, fail)

    def start(self, name: str) -> None:
        self.items.pop(name).start()

    def fail(self, name: str, message: str) -> None:
        waiting = self.items.pop(name, None)
        if waiting is not None:
            waiting.fail(message)

    def clear(self) -> None:
        self.items.clear()


queue = Queue()
