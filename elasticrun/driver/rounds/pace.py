"""Pure: who holds a round up — the members' pace, judged tick by tick.

In synchronous training every member waits in each collective for the last one to arrive,
so the slow member is the one that waits least. Each member reports, every second or so,
the share of its time its training thread spent *outside* collectives (its busy share:
elasticrun's collectives time themselves; a torchrun-style DDP script's reducer times its
gradient reduction, with CUDA events on a GPU). At each tick a member's slowdown is its busy
share over the median of its peers': 1.0 when all work alike, about 5 for a member 5x
slower (its peers wait four fifths of each step for it).

A member is a straggler when its slowdown is at least MARGIN at PERSIST of the last WINDOW
ticks; it is cleared when it is slow at CLEAR or fewer. So a one-off pause (a long
checkpoint save, a garbage collection) of a few seconds is never named, nor is a job slowed
down as a whole (every member's busy share rises alike). A tick is taken only when every
member of the round has a fresh report of that round (the worker side leaves out the time a
round forms and its state is synced), so a stopped member names nobody: hang detection's.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

MARGIN = 1.3  # busier than the peers' median by this factor: slow at that tick
WINDOW = 10  # ticks looked at (about a second each)
PERSIST = 8  # slow at this many of them: a straggler
CLEAR = 2  # a straggler slow at no more than this many of them: cleared
TICK_S = 1.0  # ticks are at least this far apart
FRESH_S = 3.0  # a member's report older than this: no tick (it may be stopped)
IDLE_FLOOR = 0.01  # peers never count as busy less than this (a slowdown stays finite)
EVICT_GAIN = 1.1  # a straggler is evicted only if the job is projected this much faster


@dataclass(frozen=True)
class PaceReport:
    """One member's report: over its last `interval_s` in `round`, the share of the time
    its training thread spent outside collectives."""

    round: int
    busy: float
    interval_s: float


@dataclass
class Track:
    """One worker's recent ticks: slow or not, and its slowdown at each."""

    slow: deque[bool] = field(default_factory=lambda: deque(maxlen=WINDOW))
    slowdowns: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    busy: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    named: bool = False

    def slowdown(self) -> float:
        """Its typical slowdown over the window (the median: one tick says little)."""
        return statistics.median(self.slowdowns) if self.slowdowns else 1.0


@dataclass
class PaceBook:
    latest: dict[str, tuple[float, PaceReport]] = field(default_factory=dict)  # at, report
    tracks: dict[str, Track] = field(default_factory=dict)
    last_tick: float = float("-inf")


@dataclass(frozen=True)
class Change:
    worker: str
    named: bool  # True: newly a straggler; False: cleared
    slowdown: float


def slowdowns(busy: Mapping[str, float]) -> dict[str, float]:
    """Each member's busy share over the median of its peers' (a lone member: 1.0)."""
    out: dict[str, float] = {}
    for worker, share in busy.items():
        peers = [other for name, other in busy.items() if name != worker]
        out[worker] = share / max(IDLE_FLOOR, statistics.median(peers)) if peers else 1.0
    return out


def projected_gain(busy: Mapping[str, float], straggler: str) -> float:
    """The job's samples per second without `straggler` over those with it: one member
    fewer, each step as long as the busiest remaining member's work rather than the
    straggler's. `busy`: each member's typical busy share (typical_busy)."""
    others = [share for worker, share in busy.items() if worker != straggler]
    if not others:
        return 0.0
    size = len(busy)
    return (size - 1) / size * busy[straggler] / max(IDLE_FLOOR, max(others))


def note(book: PaceBook, worker: str, report: PaceReport, now: float) -> None:
    book.latest[worker] = (now, report)


def tick(book: PaceBook, members: Iterable[str], round_number: int,
         now: float) -> list[Change] | None:
    """Judges the members' latest reports, at most once a TICK_S: None when no tick is due
    or some member has no fresh report of `round_number`; else the members newly named
    stragglers or cleared."""
    members = list(members)
    if now - book.last_tick < TICK_S or len(members) < 2:
        return None
    busy: dict[str, float] = {}
    for worker in members:
        at, report = book.latest.get(worker, (float("-inf"), None))
        if report is None or report.round != round_number or at <= book.last_tick \
                or now - at > FRESH_S:
            return None  # (each tick judges a new report of every member)
        busy[worker] = report.busy
    book.last_tick = now
    for gone in set(book.tracks) - set(members):
        del book.tracks[gone]
    changes: list[Change] = []
    for worker, slowdown in slowdowns(busy).items():
        track = book.tracks.setdefault(worker, Track())
        track.slow.append(slowdown >= MARGIN)
        track.slowdowns.append(slowdown)
        track.busy.append(busy[worker])
        count = sum(track.slow)
        if not track.named and count >= PERSIST:
            track.named = True
            changes.append(Change(worker, True, track.slowdown()))
        elif track.named and count <= CLEAR:
            track.named = False
            changes.append(Change(worker, False, track.slowdown()))
    return changes


def typical_busy(book: PaceBook, members: Iterable[str]) -> dict[str, float]:
    """The members' typical busy shares over the window (those judged at least once)."""
    return {worker: statistics.median(book.tracks[worker].busy) for worker in members
            if worker in book.tracks and book.tracks[worker].busy}


def forget(book: PaceBook, worker: str) -> None:
    book.latest.pop(worker, None)
    book.tracks.pop(worker, None)
