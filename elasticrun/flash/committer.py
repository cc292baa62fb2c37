"""Takes flash commits: the step's state copied on the training thread, written off it.

At the end of a step the training thread copies the state into buffers kept from earlier
commits (no allocation once shapes are stable; CUDA tensors into pinned host memory, the
copy queued on the tensors' stream, so the thread does not wait for it) and hands them to
a writer thread, which writes them into the host's flash commit files (store.py). The
writer reads the buffers in place (no second copy in memory: a process holds one copy of
the state, its host's /dev/shm three more, the two newest commits and the one being
written); while it writes, a commit that comes due is put off, never waited for. How often
a commit is due is the cadence's (cadence.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from elasticrun.flash.store import KEPT, SHARED, FlashStore, own_part
from elasticrun.torch.elastic.cadence import Cadence
from elasticrun.torch.elastic.snapshot import Placement, snapshot

log = logging.getLogger("elasticrun.flash")

# What a commit holds: the part written once a host (None: this rank writes none) and this
# rank's own part.
Capture = Callable[[], "tuple[Any | None, Any]"]


@dataclass
class _Buffers:
    placement: Placement = field(default_factory=lambda: Placement("host"))
    shared: Any = None
    own: Any = None
    busy: bool = False  # handed to the writer, not written yet


@dataclass(frozen=True)
class CommitStats:
    commits: int  # flash commits written
    skipped: int  # commits put off while the writer was still busy
    every: int  # the cadence in force
    copy_s: float  # a commit's copy on the training thread (the recent median)
    step_s: float  # a step without the copy (the recent median)


class FlashCommitter:
    def __init__(self, store: FlashStore, rank: int, cadence: Cadence | None = None,
                 written: Callable[[CommitStats], None] | None = None,
                 own_kept: int = KEPT) -> None:
        """`written`: called by the writer thread after each commit written; `own_kept`:
        how many of this rank's own parts are kept (store.py)."""
        self.store = store
        self._own_kept = own_kept
        self._on_written = written
        self.rank = rank
        self.cadence = cadence or Cadence()
        self._buffers = _Buffers()
        self._last_end: float | None = None  # when the last step_ended() returned
        self._writing_at_end = False  # and whether a write was running then
        self._taken = 0
        self._written = 0
        self._skipped = 0
        self._lock = threading.Condition()
        self._queue: list[tuple[int, _Buffers]] = []
        self._failed: set[str] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._write_loop, name="elasticrun-flash",
                                        daemon=True)
        self._thread.start()

    def step_ended(self, step: int, capture: Capture) -> bool:
        """Called by the training thread once a step is done; takes a commit of it when the
        cadence says one is due. Whether it took one."""
        now = time.perf_counter()
        with self._lock:  # (the writer thread tells the cadence of its writes)
            writing = self._buffers.busy
            if self._last_end is not None:  # (a step's time, without the last commit's copy)
                self.cadence.stepped(now - self._last_end, writing or self._writing_at_end)
        taken = False
        if self.cadence.due(step):
            buffers = self._buffers
            with self._lock:
                free = not buffers.busy
            if free:
                shared, own = capture()
                buffers.shared = None if shared is None else snapshot(
                    shared, buffers.shared, buffers.placement)
                buffers.own = snapshot(own, buffers.own, buffers.placement)
                buffers.placement.copied()
                with self._lock:
                    buffers.busy = True
                    self._queue.append((step, buffers))
                    self._lock.notify_all()
                copy_s = time.perf_counter() - now
                self._taken += 1
                if self._taken > 1:  # the first copy allocates the buffers
                    with self._lock:
                        self.cadence.copied(copy_s)
                taken = True
            else:
                self._skipped += 1
        self._last_end = time.perf_counter()
        self._writing_at_end = self._buffers.busy  # (the next step runs beside the write)
        return taken

    def stats(self) -> CommitStats:
        return CommitStats(self._written, self._skipped, self.cadence.every,
                           self.cadence.copy_s, self.cadence.step_s)

    def flush(self, timeout: float = 60.0) -> bool:
        """Waits until every commit taken is written (at most `timeout`); whether it was."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._queue or self._buffers.busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def _write_loop(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._lock.wait()
                if not self._queue:
                    return
                step, buffers = self._queue[0]
            buffers.placement.settle()
            began = time.perf_counter()
            try:
                if buffers.shared is not None:
                    self.store.write(step, SHARED, {"state": buffers.shared})
                self.store.write(step, own_part(self.rank), {"state": buffers.own},
                                 self._own_kept)
                self._written += 1
                with self._lock:
                    self.cadence.wrote(time.perf_counter() - began)
                if self._on_written is not None:
                    self._on_written(self.stats())
            except Exception as exc:  # a full /dev/shm, an object that cannot be pickled
                self._warn_once(type(exc).__name__, f"a flash commit of step {step} was "
                                f"not written: {exc}")
            with self._lock:
                self._queue.pop(0)
                buffers.busy = False
                self._lock.notify_all()

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._failed:
            self._failed.add(kind)
            log.warning("elasticrun: %s", message)
