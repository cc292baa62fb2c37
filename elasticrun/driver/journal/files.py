"""The driver's journal on disk: one snapshot file, replaced whole, the previous one kept.

Slurm's way with its state files: the new snapshot is written beside the current one
(`.new`), flushed to the disk (fsync), and renamed over it, after the current one was
linked as `.old`; the directory is fsynced so that the renames survive a crash too. The
current name is never missing once written (restart scripts test it to add --resume), and
a reader finds a whole snapshot, the current or the previous one, whatever moment a crash
hit (or the `.new` one, complete, when the crash came between the write and the renames).
Each snapshot carries a format version and a checksum of its body: a truncated or
corrupt file is recognised as such and the previous one is used; when neither is valid,
reading refuses in one line (JournalError) rather than resume half a job.

Files are 0600 (a snapshot names the job's secret file, and its round's store entries).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticrun.job.errors import ElasticrunError

FORMAT = 1
NAME = "journal.json"


class JournalError(ElasticrunError):
    """No valid snapshot to resume from (missing, truncated, corrupt, of another format)."""


@dataclass(frozen=True)
class Snapshot:
    """What was read back: the body, and which file it came from ("new", "current" or
    "previous")."""

    body: dict[str, Any]
    source: str


def _encode(body: dict[str, Any]) -> bytes:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()
    return json.dumps({"format": FORMAT, "sha256": digest, "body": body}, sort_keys=True,
                      separators=(",", ":")).encode() + b"\n"


def _decode(data: bytes) -> dict[str, Any]:
    """The body of a snapshot file, or ValueError saying what is wrong with it."""
    try:
        wrapper = json.loads(data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError("not JSON (truncated or overwritten)") from exc
    if not isinstance(wrapper, dict) or not isinstance(wrapper.get("body"), dict):
        raise ValueError("not a journal snapshot")
    if wrapper.get("format") != FORMAT:
        raise ValueError(f"format {wrapper.get('format')!r}, expected {FORMAT}")
    body: dict[str, Any] = wrapper["body"]
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    if hashlib.sha256(text.encode()).hexdigest() != wrapper.get("sha256"):
        raise ValueError("checksum mismatch")
    return body


class JournalFiles:
    """The snapshot files of one job, in `directory` (made 0700 if missing)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.current = directory / NAME
        self.previous = directory / f"{NAME}.old"
        self._new = directory / f"{NAME}.new"

    def write(self, body: dict[str, Any]) -> None:
        """Replaces the current snapshot with `body`, keeping the current one as previous."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        descriptor = os.open(self._new, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            data = _encode(body)
            view = memoryview(data)
            while view:
                view = view[os.write(descriptor, view):]
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        self._keep_as_previous()
        os.replace(self._new, self.current)
        self._sync_directory()

    def _keep_as_previous(self) -> None:
        """The current snapshot becomes the previous one while its own name stays (a second
        link, renamed over `.old`): the current name, once written, never goes missing, not
        even for a moment, so that a script's `[ -e journal.json ] && echo --resume` cannot
        start a second job beside the first one's live workers."""
        staged = self.directory / f"{NAME}.old.new"
        staged.unlink(missing_ok=True)
        try:
            os.link(self.current, staged)
        except FileNotFoundError:  # the first snapshot
            return
        except OSError:  # a filesystem without hard links
            shutil.copyfile(self.current, staged)
            os.chmod(staged, 0o600)
        os.replace(staged, self.previous)
        staged.unlink(missing_ok=True)  # left when both were links of one file (a crash's)

    def read(self) -> Snapshot:
        """The newest valid snapshot; JournalError (one line) when there is none."""
        problems = []
        # A valid .new is the newest: the driver died after writing it, before the renames.
        candidates = (("new", self._new), ("current", self.current),
                      ("previous", self.previous))
        for source, path in candidates:
            try:
                return Snapshot(_decode(path.read_bytes()), source)
            except FileNotFoundError:
                if source != "new":
                    problems.append(f"{path.name}: missing")
            except (OSError, ValueError) as exc:
                problems.append(f"{path.name}: {exc}")
        raise JournalError(f"cannot resume from {self.directory}: no valid journal snapshot "
                           f"({'; '.join(problems)})")

    def _sync_directory(self) -> None:
        descriptor = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
