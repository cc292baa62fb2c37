"""Keeping commits outside the worker (keeper.py): which kept commit a round restores, the
settings the driver passes, and the writer threads, run for real on temporary directories."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from elasticrun import protocol
from elasticrun.torch.elastic import commit_files, keeper
from elasticrun.torch.elastic.commit_files import WHOLE
from elasticrun.torch.elastic.keeper import CommitKeeper, KeepingSettings, Offer, choose

WAIT_S = 30.0  # a bound on waits that end at once when the code is right


# --- choose: the policy -------------------------------------------------------------------
def _host(commit: int) -> Offer:
    return Offer(commit, "host", f"/dev/shm/x/{commit}", "h")


def _disk(commit: int) -> Offer:
    return Offer(commit, "checkpoint dir", f"/ckpt/{commit}")


@pytest.mark.parametrize(("offers", "expected"), [
    ([None, None], None),
    ([], None),
    ([_host(3)], 0),
    ([None, _disk(2)], 1),
    ([_host(4), _host(7), _host(5)], 1),            # the newest commit wins
    ([_host(4), _disk(9)], 1),                      # newest before host memory
    ([_disk(6), _host(6), _disk(6)], 1),            # same commit: host memory first
    ([_disk(6), None, _disk(6)], 0),                # a tie: the lowest rank
    ([None, _host(6), _disk(6), _host(6)], 1),      # host ties: the lowest rank
], ids=["none", "no ranks", "one", "one of two", "newest", "newest on disk",
        "host before disk", "lowest rank", "lowest host rank"])
def test_choose(offers: list[Offer | None], expected: int | None) -> None:
    chosen = choose(offers)
    if expected is None:
        assert chosen is None
        return
    assert chosen == (expected, offers[expected])


def test_offer_is_the_newest_complete_commit_host_first(tmp_path: Path) -> None:
    host, disk = tmp_path / "shm", tmp_path / "disk"
    host.mkdir()
    disk.mkdir()
    settings = KeepingSettings(host, disk)
    assert keeper.offer(settings, WHOLE) is None
    _write(disk, 5)
    _write(host, 5)
    assert keeper.offer(settings, WHOLE) == \
        Offer(5, "host", str(host / commit_files.file_name(5, WHOLE)))
    _write(disk, 6)
    found = keeper.offer(settings, WHOLE)
    assert found is not None and (found.commit, found.place) == (6, "checkpoint dir")
    assert keeper.offer(KeepingSettings(), WHOLE) is None


# --- settings from the driver's environment -----------------------------------------------
def test_settings_from_an_empty_environment_keep_nothing() -> None:
    settings = KeepingSettings.from_env({})
    assert settings == KeepingSettings(None, None, 60.0, False)
    assert not settings.keeps and settings.directories() == []


def test_settings_from_the_environment() -> None:
    settings = KeepingSettings.from_env({
        protocol.ENV_SNAPSHOT_DIR: "/dev/shm/elasticrun-1-j", protocol.ENV_CHECKPOINT_DIR: "/c",
        protocol.ENV_CHECKPOINT_INTERVAL: "2.5", protocol.ENV_RESTORE: "1"})
    assert settings == KeepingSettings(Path("/dev/shm/elasticrun-1-j"), Path("/c"), 2.5, True)
    assert settings.keeps
    assert settings.directories() == [("host", Path("/dev/shm/elasticrun-1-j")),
                                      ("checkpoint dir", Path("/c"))]


@pytest.mark.parametrize(("env", "expected"), [
    ({protocol.ENV_CHECKPOINT_DIR: "/c", protocol.ENV_CHECKPOINT_INTERVAL: "0"},
     KeepingSettings(None, Path("/c"), 0.0, False)),
    ({protocol.ENV_SNAPSHOT_DIR: "", protocol.ENV_CHECKPOINT_INTERVAL: "",
      protocol.ENV_RESTORE: "0"}, KeepingSettings(None, None, 60.0, False)),
])
def test_settings_edge_values(env: dict[str, str], expected: KeepingSettings) -> None:
    assert KeepingSettings.from_env(env) == expected


def test_settings_read_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(protocol.ENV_SNAPSHOT_DIR, "/dev/shm/s")
    monkeypatch.delenv(protocol.ENV_CHECKPOINT_DIR, raising=False)
    monkeypatch.delenv(protocol.ENV_CHECKPOINT_INTERVAL, raising=False)
    monkeypatch.delenv(protocol.ENV_RESTORE, raising=False)
    assert KeepingSettings.from_env() == KeepingSettings(Path("/dev/shm/s"))


# --- the writer thread --------------------------------------------------------------------
def _saved(value: float) -> dict[str, Any]:
    """What a TorchState's commit holds."""
    return {"model": {"w": torch.full((3, 2), value), "b": torch.zeros(2)},
            "optimizer": {"state": {0: {"momentum_buffer": torch.full((3, 2), -value)}},
                          "param_groups": [{"lr": 0.1, "params": [0, 1]}]},
            "objects": {"epoch": int(value), "sampler": {"epoch": 1, "processed_indices": [4]}}}


def _write(directory: Path, commit: int) -> None:
    commit_files.write(directory, commit, WHOLE,
                       commit_files.payload(commit, WHOLE, _saved(commit)), durable=False)


def _commits(directory: Path) -> list[int]:
    return [f.commit for f in commit_files.complete(directory)]


def _wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "not within the bound"
        time.sleep(0.01)


def _idle(writer: CommitKeeper) -> None:
    """The writer thread and the checkpoint copier are done with what they were given (no
    copy forced, as flush() would)."""
    with writer._wake:
        assert writer._wake.wait_for(lambda: writer._pending is None and not writer._active,
                                     timeout=WAIT_S)
    thread = writer._copier._thread
    if thread is not None:
        thread.join(WAIT_S)
        assert not thread.is_alive()


def _equal(left: Any, right: Any) -> bool:
    if isinstance(left, torch.Tensor):
        return isinstance(right, torch.Tensor) and torch.equal(left, right)
    if isinstance(left, dict):
        return isinstance(right, dict) and left.keys() == right.keys() \
            and all(_equal(left[k], right[k]) for k in left)
    return bool(left == right)


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "shm", tmp_path / "checkpoints"


def test_a_kept_commit_is_a_host_snapshot_of_it(dirs: tuple[Path, Path]) -> None:
    snapshots, _ = dirs
    writer = CommitKeeper(KeepingSettings(snapshots))
    saved = _saved(3.0)
    writer.kept(3, WHOLE, saved, host_writer=True, checkpoint_writer=True)
    writer.flush(WAIT_S)
    assert _commits(snapshots) == [3]
    content = commit_files.read(snapshots / commit_files.file_name(3, WHOLE))
    assert content["commit"] == 3 and content["holding"] == WHOLE
    assert _equal({k: content[k] for k in ("model", "optimizer", "objects")}, saved)
    assert (snapshots.stat().st_mode & 0o777) == 0o700


def test_a_later_commit_replaces_the_snapshot(dirs: tuple[Path, Path]) -> None:
    snapshots, _ = dirs
    writer = CommitKeeper(KeepingSettings(snapshots))
    for commit in (1, 2):
        writer.kept(commit, WHOLE, _saved(commit), host_writer=True, checkpoint_writer=False)
        writer.flush(WAIT_S)
    assert _commits(snapshots) == [2]
    # two slots written in place, in turn; the published commit links to the newer
    pid = os.getpid()
    assert sorted(os.listdir(snapshots)) == [commit_files.file_name(2, WHOLE),
                                             f"slot-{pid}-0.whole.pt", f"slot-{pid}-1.whole.pt"]
    assert os.readlink(snapshots / commit_files.file_name(2, WHOLE)) == f"slot-{pid}-1.whole.pt"
    assert commit_files.read(snapshots / commit_files.file_name(2, WHOLE))["commit"] == 2


def test_only_the_writers_named_write(dirs: tuple[Path, Path]) -> None:
    snapshots, checkpoints = dirs
    writer = CommitKeeper(KeepingSettings(snapshots, checkpoints, 0.0))
    writer.kept(1, WHOLE, _saved(1), host_writer=False, checkpoint_writer=False)
    writer.flush(WAIT_S)
    assert writer._thread is None
    assert not snapshots.exists() and not checkpoints.exists()
    writer.kept(2, WHOLE, _saved(2), host_writer=False, checkpoint_writer=True)
    writer.flush(WAIT_S)
    assert not snapshots.exists() and _commits(checkpoints) == [2]


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The paths of the files and directories fsynced (then really fsynced)."""
    paths: list[str] = []
    real = os.fsync

    def recording(descriptor: int) -> None:
        paths.append(str(Path(os.readlink(f"/proc/self/fd/{descriptor}")).resolve()))
        real(descriptor)

    monkeypatch.setattr(os, "fsync", recording)
    yield paths


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_with_interval_0_every_commit_reaches_the_checkpoint_dir_fsynced(
        dirs: tuple[Path, Path], fsynced: list[str]) -> None:
    snapshots, checkpoints = (d.resolve() for d in dirs)
    writer = CommitKeeper(KeepingSettings(snapshots, checkpoints, 0.0))
    for commit in (1, 2):
        writer.kept(commit, WHOLE, _saved(commit), host_writer=True, checkpoint_writer=True)
        _idle(writer)
        assert _commits(checkpoints) == [commit]
    path = checkpoints / commit_files.file_name(2, WHOLE)
    assert (path.stat().st_mode & 0o777) == 0o600
    assert (checkpoints.stat().st_mode & 0o777) == 0o700  # made by the writer: private
    content = commit_files.read(path)
    assert content["commit"] == 2 and _equal(content["model"], _saved(2)["model"])
    temporary = f"{checkpoints}/.{path.name}.tmp-{os.getpid()}"
    assert temporary in fsynced and str(checkpoints) in fsynced  # the file, then its entry
    assert not any(p.startswith(str(snapshots)) for p in fsynced)  # host memory: no fsync
    assert _commits(snapshots) == [2]  # the snapshot stays


def test_a_long_interval_copies_the_first_then_the_newest_at_flush(
        dirs: tuple[Path, Path]) -> None:
    snapshots, checkpoints = dirs
    writer = CommitKeeper(KeepingSettings(snapshots, checkpoints, 3600.0))
    writer.kept(1, WHOLE, _saved(1), host_writer=True, checkpoint_writer=True)
    _idle(writer)
    assert _commits(checkpoints) == [1]
    for commit in (2, 3):
        writer.kept(commit, WHOLE, _saved(commit), host_writer=True, checkpoint_writer=True)
        _idle(writer)
    assert _commits(snapshots) == [3]
    assert _commits(checkpoints) == [1]  # not due yet
    writer.flush(WAIT_S)
    assert _commits(checkpoints) == [3]
    content = commit_files.read(checkpoints / commit_files.file_name(3, WHOLE))
    assert _equal(content["objects"], _saved(3)["objects"])


def _staging(pid: int | None = None) -> Path:
    """Where a checkpoint writer without host snapshots stages its file (keeper.py)."""
    root = Path("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")
    return root / f"{keeper.STAGING_PREFIX}{os.getpid() if pid is None else pid}"


def test_checkpoints_only_leave_nothing_staged(dirs: tuple[Path, Path]) -> None:
    _, checkpoints = dirs
    writer = CommitKeeper(KeepingSettings(None, checkpoints, 3600.0))
    for commit in (1, 2, 3):
        writer.kept(commit, WHOLE, _saved(commit), host_writer=True, checkpoint_writer=True)
        _idle(writer)
        assert not _staging().exists() or os.listdir(_staging()) == []
    writer.flush(WAIT_S)
    assert _commits(checkpoints) == [3]
    assert not _staging().exists()


def test_a_killed_workers_staging_is_swept(dirs: tuple[Path, Path]) -> None:
    _, checkpoints = dirs
    dead = _staging(_dead_pid())
    dead.mkdir()
    (dead / commit_files.file_name(4, WHOLE)).write_bytes(b"left by a killed worker")
    shutil.rmtree(_staging(), ignore_errors=True)  # the sweep runs when this process first
    # stages (earlier tests' writers here are idle)
    writer = CommitKeeper(KeepingSettings(None, checkpoints, 0.0))
    try:
        writer.kept(1, WHOLE, _saved(1), host_writer=True, checkpoint_writer=True)
        writer.flush(WAIT_S)
        assert not dead.exists() and _commits(checkpoints) == [1]
    finally:
        shutil.rmtree(dead, ignore_errors=True)


def _dead_pid() -> int:
    process = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                             capture_output=True, text=True, check=True, timeout=60)
    return int(process.stdout)


def test_an_unwritable_snapshot_dir_warns_once_and_raises_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    writer = CommitKeeper(KeepingSettings(blocker / "snapshots"))
    with caplog.at_level(logging.WARNING, logger="elasticrun.worker"):
        for commit in (1, 2, 3):
            writer.kept(commit, WHOLE, _saved(commit), host_writer=True,
                        checkpoint_writer=True)
            writer.flush(WAIT_S)
    warnings = [r for r in caplog.records if r.name == "elasticrun.worker"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert "commit 1 could not be kept" in message and "\n" not in message
    assert writer._thread is not None and writer._thread.is_alive()  # the next commit tries


def test_hold_keeps_the_writer_off_the_copies(dirs: tuple[Path, Path]) -> None:
    """A commit refills its copies under hold(): a write of the previous commit must not
    read them meanwhile; it writes what the copies hold once the refill is done."""
    snapshots, _ = dirs
    writer = CommitKeeper(KeepingSettings(snapshots))
    saved = _saved(1)
    with writer.hold():
        writer.kept(1, WHOLE, saved, host_writer=True, checkpoint_writer=False)
        # the thread waits for the copies before it even takes the commit
        watch_until = time.monotonic() + 0.3  # a write would show at once: nothing may
        while time.monotonic() < watch_until:
            assert _commits(snapshots) == [] and not snapshots.exists()
            time.sleep(0.02)
        saved["model"]["w"].fill_(7.0)  # the refill
    writer.flush(WAIT_S)
    content = commit_files.read(snapshots / commit_files.file_name(1, WHOLE))
    assert torch.equal(content["model"]["w"], torch.full((3, 2), 7.0))


def test_a_commit_not_started_yet_is_replaced_by_the_next(
        dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    snapshots, _ = dirs
    written: list[int] = []
    real = commit_files.SlotWriter.write

    def recording(self: Any, commit: int, *args: Any, **kwargs: Any) -> Any:
        written.append(commit)
        return real(self, commit, *args, **kwargs)

    monkeypatch.setattr(commit_files.SlotWriter, "write", recording)
    writer = CommitKeeper(KeepingSettings(snapshots))
    with writer.hold():  # (a commit's save() would wait for the last write to begin first)
        for commit in (1, 2, 3):
            writer.kept(commit, WHOLE, _saved(commit), host_writer=True,
                        checkpoint_writer=False)
    writer.flush(WAIT_S)
    assert written == [3] and _commits(snapshots) == [3]


def test_a_commit_waits_for_the_last_ones_write_to_begin(dirs: tuple[Path, Path]) -> None:
    """So the newest snapshot is never older than the commit before the last, while every
    commit is due: a commit handed over is written before the next one's copies are made."""
    snapshots, _ = dirs
    writer = CommitKeeper(KeepingSettings(snapshots, snapshot_budget=1.0))
    for commit in range(1, 30):
        with writer.hold():  # the last commit's write began, and so ended: it is published
            assert _commits(snapshots) == ([] if commit == 1 else [commit - 1])
        writer.kept(commit, WHOLE, _saved(commit), host_writer=True, checkpoint_writer=False)
    writer.flush(WAIT_S)
    assert _commits(snapshots) == [29]


def test_host_snapshots_keep_within_their_share_of_the_time(dirs: tuple[Path, Path]) -> None:
    """Commits much closer together than a write lasts: snapshots of a few commits only,
    each written whole."""
    snapshots, _ = dirs
    writer = CommitKeeper(KeepingSettings(snapshots))
    big = {"model": {"w": torch.randn(4_000_000)}, "optimizer": None, "objects": {}}
    written = []
    for commit in range(1, 40):
        with writer.hold():
            written.extend(c for c in _commits(snapshots) if c not in written)
        writer.kept(commit, WHOLE, big, host_writer=True, checkpoint_writer=False)
        time.sleep(0.001)
    writer.flush(WAIT_S)
    assert writer.snapshot_every > 1
    written.extend(c for c in _commits(snapshots) if c not in written)
    assert 3 <= len(written) < 39 // 2, written  # (the first 3 are before it is measured)


def test_an_object_that_cannot_be_saved_costs_that_commit_only(
        dirs: tuple[Path, Path]) -> None:
    snapshots, _ = dirs
    writer = CommitKeeper(KeepingSettings(snapshots))
    saved = _saved(1)
    saved["objects"]["callback"] = lambda: None  # deep-copied in memory, not picklable
    writer.kept(1, WHOLE, saved, host_writer=True, checkpoint_writer=False)
    writer.flush(2.0)
    writer.kept(2, WHOLE, _saved(2), host_writer=True, checkpoint_writer=False)
    writer.flush(2.0)
    assert _commits(snapshots) == [2]
