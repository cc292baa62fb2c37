"""Keeps every commit outside the worker processes, off the training thread.

After each commit, one thread per worker writes it as this host's *host snapshot* into a
directory in host memory (/dev/shm: it survives the death of every worker process on the
host, not of the host), in place into one of two slot files (commit_files.SlotWriter). Only
the writers the state's holding names write: for state every rank holds whole, the lowest
rank on each host (one copy per host), and rank 0 for --checkpoint-dir, where a commit is
staged as a file of its own when a copy is due and copied on (checkpoint_copier.py).

The thread reads the commit's copies in place (no second copy in memory); it takes a commit
only holding them, and the next commit waits for that write to begin, and so end (`hold`).
A write takes CPU time the training would have, so host snapshots keep to the cadence rule
of flash commits (cadence.py): every commit while a write costs under 2% of the time
between commits, else every k-th commit (those divisible by k), k the smallest that keeps
them within 2%. A host snapshot is then at most k + 1 commits behind the job's last (k is
1 for most models on a GPU: a write is a copy from pinned memory to /dev/shm); each shard
of a sharded state is written at every commit (every shard index must hold the same one).
A failed write (a full /dev/shm, an object that cannot be pickled) is logged once and costs
only that commit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticrun import protocol
from elasticrun.torch.elastic import commit_files
from elasticrun.torch.elastic.cadence import BUDGET, Cadence
from elasticrun.torch.elastic.checkpoint_copier import CheckpointCopier
from elasticrun.torch.elastic.commit_files import CommitFile

log = logging.getLogger("elasticrun.worker")



@dataclass(frozen=True)
class KeepingSettings:
    snapshot_dir: Path | None = None  # host snapshots (None: off)
    checkpoint_dir: Path | None = None
    checkpoint_interval: float = 60.0
    restore_expected: bool = False  # a total loss: a snapshot must be found
    snapshot_budget: float = BUDGET  # host snapshots' share of the training time (cadence)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KeepingSettings:
        env = os.environ if env is None else env
        snapshots = env.get(protocol.ENV_SNAPSHOT_DIR, "")
        checkpoints = env.get(protocol.ENV_CHECKPOINT_DIR, "")
        return cls(Path(snapshots) if snapshots else None,
                   Path(checkpoints) if checkpoints else None,
                   float(env.get(protocol.ENV_CHECKPOINT_INTERVAL, "60") or 60),
                   env.get(protocol.ENV_RESTORE) == "1")

    @property
    def keeps(self) -> bool:
        return self.snapshot_dir is not None or self.checkpoint_dir is not None

    def directories(self) -> list[tuple[str, Path]]:
        """Where complete commits may be found, with the name of each place, in the order
        they are preferred for the same commit (host memory first)."""
        places = []
        if self.snapshot_dir is not None:
            places.append(("host", self.snapshot_dir))
        if self.checkpoint_dir is not None:
            places.append(("checkpoint dir", self.checkpoint_dir))
        return places


@dataclass(frozen=True)
class Offer:
    """The newest complete commit one rank can read: what the ranks compare."""

    commit: int
    place: str  # "host" or "checkpoint dir"
    path: str
    host: str = ""  # the host of the rank that offers it

    @property
    def where(self) -> str:
        return f"host {self.host}" if self.place == "host" else f"checkpoint dir {self.path}"


def offer(settings: KeepingSettings, holding: str) -> Offer | None:
    best: Offer | None = None
    for place, directory in settings.directories():
        found = commit_files.newest(directory, holding)
        if found is not None and (best is None or found.commit > best.commit):
            best = Offer(found.commit, place, str(found.path))
    return best


def choose(offers: list[Offer | None]) -> tuple[int, Offer] | None:
    """The rank whose offer the round restores from: the newest commit, host memory before
    a checkpoint dir, then the lowest rank."""
    ranked = [(o.commit, o.place == "host", -rank, rank, o)
              for rank, o in enumerate(offers) if o is not None]
    if not ranked:
        return None
    *_, rank, chosen = max(ranked, key=lambda r: r[:3])
    return rank, chosen


STAGING_PREFIX = "elasticrun-staging-"
HOLD_WAIT_S = 60.0  # a commit waits at most this long for the last one's write to begin


def _sweep_staging(root: Path) -> None:
    """Removes the staging directories of this user's workers that are gone (killed)."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            pid = entry.name.removeprefix(STAGING_PREFIX)
            if entry.name.startswith(STAGING_PREFIX) and pid.isdigit() \
                    and entry.stat().st_uid == os.getuid() and not commit_files.alive(int(pid)):
                shutil.rmtree(entry.path, ignore_errors=True)


class CommitKeeper:
    """The writer thread of one worker (started at its first commit to keep)."""

    def __init__(self, settings: KeepingSettings) -> None:
        self.settings = settings
        self._busy = threading.Lock()  # held while a commit's copies are being written
        self._wake = threading.Condition()
        # (commit, holding, copies, host snapshot?, checkpoint?, checkpoint due now?, ready)
        self._pending: tuple[int, str, Mapping[str, Any], bool, bool, bool,
                             Callable[[], None] | None] | None = None
        self._active = False
        self._thread: threading.Thread | None = None
        self._copier = CheckpointCopier(settings.checkpoint_dir, settings.checkpoint_interval,
                                        self._warn_once)
        self._warned: set[str] = set()
        # Host snapshots within 2% of the training time (cadence.py): the write's time
        # against the time between commits.
        self._cadence = Cadence(budget=settings.snapshot_budget)
        self._cadence_lock = threading.Lock()
        self._last_kept: float | None = None
        self._writes = 0
        self._slots: commit_files.SlotWriter | None = None
        self._last: tuple[int, str, Mapping[str, Any]] | None = None  # (for the checkpoint)
        # Without host snapshots, a commit on its way to --checkpoint-dir is staged here.
        self._staging = Path("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp") / \
            f"{STAGING_PREFIX}{os.getpid()}"

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """While held, no write reads the commit's copies (a commit refills them). It is
        taken once the last commit's write has begun (and so, holding the copies, ended):
        the newest snapshot is then never older than this rank's commit before the last."""
        with self._wake:
            self._wake.wait_for(lambda: self._pending is None, timeout=HOLD_WAIT_S)
        with self._busy:
            yield

    def kept(self, commit: int, holding: str, saved: Mapping[str, Any],
             host_writer: bool, checkpoint_writer: bool,
             ready: Callable[[], None] | None = None, checkpoint_due: bool | None = None
             ) -> None:
        """Commit `commit` is in `saved` now (once `ready()` returns: copies still in flight
        on a GPU): the thread writes it, replacing one not yet started. `checkpoint_due`:
        whether it goes to the checkpoint dir (None: when --checkpoint-interval says; a
        sharded state's ranks decide together, so that every shard index has the commit)."""
        snapshot = host_writer and self.settings.snapshot_dir is not None \
            and (self._snapshot_due(commit) or commit_files.parse_shard(holding) is not None)
        checkpoint = checkpoint_writer and self.settings.checkpoint_dir is not None \
            and checkpoint_due is not False
        if not snapshot and not checkpoint:
            return
        with self._wake:
            self._pending = (commit, holding, saved, snapshot, checkpoint,
                             checkpoint_due is True, ready)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="elasticrun-keeper",
                                                daemon=True)
                self._thread.start()
            self._wake.notify_all()

    def _snapshot_due(self, commit: int) -> bool:
        now = time.monotonic()
        with self._cadence_lock:
            if self._last_kept is not None:
                self._cadence.stepped(now - self._last_kept)
            self._last_kept = now
            return self._cadence.due(commit)

    @property
    def snapshot_every(self) -> int:
        """The host snapshots' cadence in force: every `snapshot_every` commits."""
        return self._cadence.every

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._pending is None:
                    self._wake.wait()
            self._busy.acquire()  # before the commit is taken: its copies cannot change now
            with self._wake:
                assert self._pending is not None  # (only this thread takes it)
                commit, holding, saved, snapshot, checkpoint, due, ready = self._pending
                self._pending = None
                self._active = True
                self._wake.notify_all()
            try:
                staged = None
                with contextlib.ExitStack() as held:
                    held.callback(self._busy.release)
                    if ready is not None:
                        ready()
                    if snapshot:
                        began = time.monotonic()
                        self._write_snapshot(commit, holding, saved)
                        self._wrote(time.monotonic() - began)
                    if checkpoint:
                        self._last = (commit, holding, saved)
                        if due or self._copier.due():
                            staged = self._stage(commit, holding, saved)
                if staged is not None:
                    self._copier.offer(staged)
            except Exception as exc:  # this commit is not kept; the next ones still are
                self._warn_once("keeping", f"commit {commit} could not be kept: "
                                           f"{type(exc).__name__}: {exc}")
            finally:
                with self._wake:
                    self._active = False
                    self._wake.notify_all()

    def _wrote(self, seconds: float) -> None:
        self._writes += 1
        if self._writes > 2:  # the first writes make the slot files' pages
            with self._cadence_lock:
                self._cadence.copied(seconds)

    def _write_snapshot(self, commit: int, holding: str, saved: Mapping[str, Any]) -> None:
        """The commit as this host's snapshot (in place, in host memory)."""
        directory = self.settings.snapshot_dir
        assert directory is not None
        try:
            if self._slots is None:
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                self._slots = commit_files.SlotWriter(directory)
            written = self._slots.write(commit, holding,
                                        commit_files.payload(commit, holding, saved))
            commit_files.prune(directory, written)
        except Exception as exc:  # a full disk (OSError, RuntimeError), an unpicklable object
            self._warn_once("snapshot", f"commit {commit} could not be kept in {directory} "
                                        f"({getattr(exc, 'strerror', None) or exc}); no host "
                                        f"snapshot of it (is /dev/shm big enough? can every "
                                        f"committed object be pickled?)")

    def _stage(self, commit: int, holding: str, saved: Mapping[str, Any]) -> CommitFile | None:
        """The commit as a file of its own (with CRCs) on its way to the checkpoint dir."""
        directory = self._staging
        try:
            if not directory.exists():
                _sweep_staging(directory.parent)
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            return commit_files.write(directory, commit, holding,
                                      commit_files.payload(commit, holding, saved),
                                      durable=False)
        except Exception as exc:
            self._warn_once("checkpoint", f"commit {commit} could not be staged for the "
                                          f"checkpoint dir in {directory} "
                                          f"({getattr(exc, 'strerror', None) or exc})")
            return None

    def flush(self, timeout: float = 60.0) -> None:
        """Waits (bounded) for the writes in flight, then writes the newest snapshot to the
        checkpoint dir if it is not there yet: the last commit is kept when a worker ends."""
        deadline = time.monotonic() + timeout
        with self._wake:
            self._wake.wait_for(lambda: self._pending is None and not self._active,
                                timeout=timeout)
        last = self._last
        if last is not None and not self._copier.has(last[0]):
            with self._busy:
                staged = self._stage(*last)
            if staged is not None:
                self._copier.offer(staged)
        self._copier.finish(max(0.0, deadline - time.monotonic()))
        shutil.rmtree(self._staging, ignore_errors=True)

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning(message)
