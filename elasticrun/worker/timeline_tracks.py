"""The threads of a worker's timeline lane, so that every thread's events nest.

Trace viewers draw a thread's complete events as a stack: two that overlap without one
holding the other are misdrawn (Perfetto reports them as errors). Collectives in flight at
once (fused buckets, async handles) overlap like that, so each category has a thread, and
an event that does not nest there goes to the category's next thread, and so on.

Events come in the order they end (they are recorded when they end). On a thread whose
events nest, only its outermost events decide where the next one may go: it must not start
inside one of them. They are disjoint, kept in order, and the next event takes the place of
those it holds.
"""

from __future__ import annotations

KEPT = 64  # outermost events remembered per thread (at least); older ones lie far back
MAX_THREADS = 50  # per category; beyond, the last thread takes what does not fit
NO, OUTERMOST, INSIDE = 0, 1, 2  # how an event fits on a thread


class Tracks:
    def __init__(self) -> None:
        self._outer: dict[int, list[list[tuple[int, int]]]] = {}

    def place(self, category: int, start: int, end: int) -> int:
        """Which of the category's threads (0: its first) takes the event [start, end]."""
        threads = self._outer.setdefault(category, [])
        for index, outer in enumerate(threads):
            fit = _fit(outer, start, end)
            if fit == OUTERMOST:
                _add(outer, start, end)
            if fit != NO:
                return index
        if len(threads) < MAX_THREADS:
            threads.append([(start, end)])
        return len(threads) - 1


def _fit(outer: list[tuple[int, int]], start: int, end: int) -> int:
    for first, last in reversed(outer):
        if last <= start:
            return OUTERMOST  # this one, and every earlier one, ended before it began
        if first >= end:
            continue  # after the event (it ended out of order)
        if first <= start and end <= last:
            return INSIDE  # within an outermost event
        if not (start <= first and last <= end):
            return NO  # overlaps without nesting
    return OUTERMOST


def _add(outer: list[tuple[int, int]], start: int, end: int) -> None:
    """The event becomes outermost; the outermost events it holds are no longer."""
    while outer and start <= outer[-1][0] and outer[-1][1] <= end:
        outer.pop()
    if outer and outer[-1][0] > start:  # it ended out of order: its place is further back
        outer[:] = sorted([(first, last) for first, last in outer
                           if not (start <= first and last <= end)] + [(start, end)])
    else:
        outer.append((start, end))
    if len(outer) > 2 * KEPT:
        del outer[:-KEPT]
