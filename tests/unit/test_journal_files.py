"""The journal's snapshot files: replaced whole, the previous kept, damage recognised."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from elasticrun.driver.journal.files import JournalError, JournalFiles


def test_a_written_snapshot_reads_back_and_the_one_before_is_kept(tmp_path: Path) -> None:
    files = JournalFiles(tmp_path / "state")
    files.write({"epoch": 1, "round": 3})
    files.write({"epoch": 1, "round": 4})
    snapshot = files.read()
    assert snapshot.body == {"epoch": 1, "round": 4} and snapshot.source == "current"
    files.current.unlink()
    assert files.read().body == {"epoch": 1, "round": 3}  # the previous one


def test_files_are_private(tmp_path: Path) -> None:
    files = JournalFiles(tmp_path / "state")
    files.write({"secret_file": "/run/job/secret"})
    files.write({"secret_file": "/run/job/secret"})
    assert stat.S_IMODE(files.directory.stat().st_mode) == 0o700
    for path in (files.current, files.previous):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize("damage", ["truncated", "flipped", "empty", "other-format"])
def test_a_damaged_current_snapshot_gives_way_to_the_previous(tmp_path: Path,
                                                              damage: str) -> None:
    files = JournalFiles(tmp_path)
    files.write({"round": 1})
    files.write({"round": 2, "members": ["w-1", "w-2"]})
    data = files.current.read_bytes()
    damaged = {"truncated": data[:len(data) // 2],
               "flipped": data.replace(b"w-2", b"w-3"),
               "empty": b"",
               "other-format": data.replace(b'"format":1', b'"format":99')}[damage]
    files.current.write_bytes(damaged)
    snapshot = files.read()
    assert snapshot.body == {"round": 1} and snapshot.source == "previous"


def test_a_complete_new_snapshot_left_by_a_crash_before_the_renames_is_the_newest(
        tmp_path: Path) -> None:
    files = JournalFiles(tmp_path)
    files.write({"round": 1})
    files.write({"round": 2})
    files.current.rename(tmp_path / "journal.json.new")  # as if the renames never happened
    files.previous.rename(files.current)
    assert files.read().body == {"round": 2}
    (tmp_path / "journal.json.new").write_bytes(b'{"format":1,"sha')  # a write cut short
    assert files.read().body == {"round": 1}


def test_the_current_snapshot_is_never_missing_while_the_next_replaces_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver killed between the renames: the current name still holds a whole snapshot
    (a restart script's `[ -e journal.json ] && echo --resume` must find it)."""
    files = JournalFiles(tmp_path)
    files.write({"round": 1})
    real_replace = os.replace

    def killed_before_the_last_rename(src: object, dst: object) -> None:
        if Path(str(dst)) == files.current:
            raise KeyboardInterrupt  # stands for the SIGKILL
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", killed_before_the_last_rename)
    with pytest.raises(KeyboardInterrupt):
        files.write({"round": 2})
    monkeypatch.undo()
    assert files.current.exists() and files.previous.exists()
    assert JournalFiles(tmp_path).read().body == {"round": 2}  # the complete .new
    (tmp_path / "journal.json.new").unlink()
    assert JournalFiles(tmp_path).read().body == {"round": 1}
    files.write({"round": 3})
    assert files.read().body == {"round": 3} and files.read().source == "current"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "journal.json", "journal.json.old"]


def test_no_valid_snapshot_is_refused_in_one_line(tmp_path: Path) -> None:
    files = JournalFiles(tmp_path)
    with pytest.raises(JournalError) as missing:
        files.read()
    assert "\n" not in str(missing.value) and "journal.json: missing" in str(missing.value)
    files.write({"round": 1})
    files.write({"round": 2})
    files.current.write_bytes(b"garbage")
    files.previous.write_bytes(b"")
    with pytest.raises(JournalError) as corrupt:
        files.read()
    message = str(corrupt.value)
    assert "\n" not in message and str(tmp_path) in message
    assert "journal.json: not JSON" in message and "journal.json.old: not JSON" in message
