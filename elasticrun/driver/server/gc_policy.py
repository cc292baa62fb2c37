"""The collector's pace in the driver's process, which holds a connection and a request for
every worker while a round's joins arrive.

With CPython's default thresholds (700, 10, 10), a full collection runs each time the
objects that survived grow by a quarter: while 4,096 held joins pile up, six full passes
over everything the driver holds (~25% of the server's CPU in a round). Collecting the
youngest generation every 50,000 allocations instead of 700 lets a round's requests come
and go between collections, and the objects alive at start-up (imported modules, the
app) are moved out of the collector's sight, so a full pass walks only what the job holds.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
_applied = False


def pace_for_serving() -> None:
    """Sets the pace once per process (later calls do nothing): the driver starts one
    server, tests start many."""
    global _applied
    if _applied:
        return
    _applied = True
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    gc.freeze()
