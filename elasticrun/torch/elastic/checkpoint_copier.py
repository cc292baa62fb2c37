"""Copies staged commit files into --checkpoint-dir, on a thread of its own (keeper.py
stages them): fsynced, renamed into place, the older one removed once the newer is whole.
A copy never holds a commit up: when commits come faster than the disk, the newest waits."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elasticrun.torch.elastic import commit_files
from elasticrun.torch.elastic.commit_files import CommitFile


class CheckpointCopier:
    """Copies snapshot files into the checkpoint dir on a thread of its own: at most once
    every interval, one at a time; the newest snapshot waiting while a copy is in flight is
    copied after it (when due), and whatever waits is copied when the worker ends."""

    def __init__(self, directory: Path | None, interval: float,
                 warn: Callable[[str, str], None]) -> None:
        self._directory = directory
        self._interval = interval
        self._warn = warn
        self._lock = threading.Lock()
        self._waiting: tuple[Any, CommitFile] | None = None  # an open file, and what it is
        self._thread: threading.Thread | None = None
        self._last = -float("inf")
        self._done: int | None = None  # the newest commit copied
        self._copying = -1  # the commit being copied

    def due(self) -> bool:
        """Whether a commit staged now would be copied now (none in flight, the interval
        passed): only then is one staged."""
        with self._lock:
            idle = self._thread is None or not self._thread.is_alive()
            return idle and time.monotonic() - self._last >= self._interval

    def has(self, commit: int) -> bool:
        """Whether `commit` (or a newer one) is in the checkpoint dir or on its way."""
        with self._lock:
            waiting = self._waiting[1].commit if self._waiting is not None else -1
        return max(self._done or -1, waiting, self._copying) >= commit

    def offer(self, written: CommitFile) -> None:
        source = open(written.path, "rb")  # noqa: SIM115 - closed by whoever copies or drops it
        written.path.unlink()  # an open file stays readable; nothing is left behind
        with self._lock:
            if self._waiting is not None:
                self._waiting[0].close()
            self._waiting = (source, written)
            if self._thread is None or not self._thread.is_alive():
                self._start_if_due(force=False)

    def _start_if_due(self, force: bool) -> None:
        if self._waiting is None:
            return
        if not force and time.monotonic() - self._last < self._interval:
            return
        self._last = time.monotonic()
        job, self._waiting = self._waiting, None
        self._thread = threading.Thread(target=self._copy_all, args=(job,),
                                        name="elasticrun-checkpoint", daemon=True)
        self._thread.start()

    def _copy_all(self, job: tuple[Any, CommitFile]) -> None:
        while True:
            self._copy(*job)
            with self._lock:
                if self._waiting is None or time.monotonic() - self._last < \
                        self._interval:
                    return
                self._last = time.monotonic()
                job, self._waiting = self._waiting, None

    def _copy(self, source: Any, written: CommitFile) -> None:
        self._copying = written.commit
        directory = self._directory
        assert directory is not None
        final = directory / written.path.name
        temporary = directory / f".{final.name}.tmp-{os.getpid()}"
        try:
            with source:
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                with open(temporary, "wb") as target:
                    shutil.copyfileobj(source, target, 8 << 20)
                    target.flush()
                    os.fsync(target.fileno())
            os.chmod(temporary, 0o600)
            os.replace(temporary, final)
            descriptor = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
            commit_files.prune(directory, CommitFile(final, written.commit, written.holding))
            self._done = written.commit
        except OSError as exc:
            with contextlib.suppress(OSError):
                temporary.unlink()
            self._warn("checkpoint", f"commit {written.commit} could not be written to "
                                     f"{directory} ({exc.strerror or exc})")

    def finish(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        with self._lock:
            self._start_if_due(force=True)
            thread = self._thread
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
