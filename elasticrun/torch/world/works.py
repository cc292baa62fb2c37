"""Waiting for a round's Gloo works, and letting go of its groups, without Gloo's threads.

Gloo can lose a send whose peer died at the moment it was written: the pair fails, but the
queued send is never told, so its work ends only at the collective timeout, however the
sockets are cut. Two things follow:
- a wait on a round's work is cut into short slices, so that an aborted round releases it
  at once (the work is then abandoned with WorkersFailedError);
- a left round's process groups are dropped only once every work elasticrun issued on them
  has ended. A Gloo group's native teardown waits for its works; were the last reference
  dropped on the main thread while the interpreter exits (an exception's traceback can hold
  one), the process would sit out the collective timeout and then abort ("terminate called
  after throwing an instance of 'gloo::IoException'", exit code 134).
No Python callback is ever attached to a work's future: Gloo runs it on its own thread,
which cannot take the GIL once the interpreter is finalising.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from elasticrun.worker.elastic import WorkersFailedError
from elasticrun.worker.liveness import STALL_REPEAT_S

# How often a wait looks whether its round was aborted (a slice that runs out costs about
# 0.1 ms: 1% of a core while a collective takes long; half a slice is the added delay
# when an abort, not Gloo, ends the wait).
WAIT_SLICE = timedelta(milliseconds=10)
# How often a left round's teardown looks whether its works have ended.
RELEASE_POLL_S = 0.05
# How long exiting waits for a teardown thread to finish or park (a group's teardown is
# quick once its works have ended).
PARK_WAIT_S = 2.0

Work = Any  # torch.distributed.Work (its stubs lack wait's timeout)
# A wait's stall reporting: after how many seconds, and whom to tell (seconds waited).
Stalled = tuple[float, Callable[[float], None]]


class InFlight:
    """The Gloo works elasticrun issued in one round that may still be running. Works end
    roughly in the order they were issued, so ended ones are let go from the front as new
    ones come (they hold their tensors)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._works: deque[Work] = deque()

    def add(self, work: Work) -> None:
        with self._lock:
            while self._works and self._works[0].is_completed():
                self._works.popleft()
            self._works.append(work)

    def pending(self) -> list[Work]:
        with self._lock:
            pending = [w for w in self._works if not w.is_completed()]
            self._works.clear()
            return pending


def wait_abortably(work: Work, aborted: Callable[[], bool], bound_s: float,
                   round_number: int, stalled: Stalled | None = None) -> None:
    """`work.wait()`, released within a slice once `aborted()`: an unfinished work is then
    abandoned with WorkersFailedError (as it is after `bound_s`, a backstop: Gloo ends
    every work at the collective timeout). A finished work returns or raises as it ended.
    `stalled`: (seconds, report): a wait that lasts that long is reported (how long it has
    waited), and again every STALL_REPEAT_S while it lasts."""
    started = time.monotonic()
    deadline = started + bound_s
    report_at = started + stalled[0] if stalled is not None else float("inf")
    while not work.is_completed() and not aborted():
        now = time.monotonic()
        if now >= deadline:
            break
        if now >= report_at:
            assert stalled is not None
            stalled[1](now - started)
            report_at = now + STALL_REPEAT_S
        try:
            work.wait(WAIT_SLICE)
            return
        except RuntimeError:  # the slice ran out ("Operation timed out!"), or Gloo's error
            continue
    if not work.is_completed():
        raise WorkersFailedError(f"round {round_number} broke while a collective was in "
                                 "flight")
    work.wait()  # its result, or the error it ended with


def drop_when_done(groups: list[Any], works: list[Work], deadline: float) -> None:
    """Drops the references in `groups` on a daemon thread, once `works` have ended (or at
    `deadline`). Until then the thread holds them, so no other thread runs the groups'
    teardown while it would wait. At interpreter exit the thread parks for good, still
    holding them: the groups are never torn down at all."""
    parked = threading.Event()

    def release() -> None:
        try:
            pending = works
            while pending and time.monotonic() < deadline and not _exiting.is_set():
                _exiting.wait(RELEASE_POLL_S)
                pending = [w for w in pending if not w.is_completed()]
            if not _exiting.is_set():
                works.clear()
                groups.clear()
                return
            parked.set()
            threading.Event().wait()  # never returns: the groups stay referenced
        finally:
            parked.set()
            _teardowns.discard(parked)

    _teardowns.add(parked)
    threading.Thread(target=release, name="elasticrun-round-teardown", daemon=True).start()


# Set at interpreter exit, once the runtime has shut down (atexit runs in reverse order of
# registration, and this module is imported before `init()` registers the shutdown).
_exiting = threading.Event()
_teardowns: set[threading.Event] = set()  # one per teardown thread: set once parked or done


def _park_teardowns() -> None:
    """A daemon thread that returns from a call that released the GIL (a work's state, a
    group's teardown) after the interpreter began finalising is ended by CPython inside a
    C++ destructor, and the process aborts ("terminate called without an active
    exception"). So, before that, every teardown thread either finishes or parks in a
    plain wait, from which it never returns."""
    _exiting.set()
    deadline = time.monotonic() + PARK_WAIT_S
    for parked in list(_teardowns):
        parked.wait(max(0.0, deadline - time.monotonic()))


atexit.register(_park_teardowns)
