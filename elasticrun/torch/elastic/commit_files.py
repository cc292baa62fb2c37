"""Commits as files: host snapshots and --checkpoint-dir checkpoints share one format.

A file is `torch.save` of a dict, readable with plain torch
(`torch.load(path, weights_only=False)`): "model" (a state_dict), "optimizer" (a
state_dict), "objects" (the other committed attributes, stateful ones as their
state_dicts), "commit" (the job's commit number), "holding" (what part of the state the
writing rank holds: "whole" for every rank of a data-parallel job, "whole.shard1of2" for
the local shards of shard index 1 of 2 (elastic HSDP)) and "format"/"version". A sharded
commit is a file per shard index; two complete commits of each are kept, so that one
commit is found whole in every index even when its writers were killed midway.

A file is whole or absent: it is written under a temporary name, flushed (fsynced where it
must survive the machine), then renamed; a writer killed midway leaves only a temporary
file, which readers never take and the next writer removes.
"""

from __future__ import annotations

import contextlib
import os
import re
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils import serialization

from elasticrun.torch.elastic.commit_fit import mismatch
from elasticrun.worker.elastic import UnrecoverableStateError

FORMAT = "elasticrun-commit"
VERSION = 1
WHOLE = "whole"  # every rank holds the whole state (data parallelism)
_SHARD = re.compile(r"^(.*)\.shard(\d+)of(\d+)$")
_NAME = re.compile(r"^commit-(\d{12})\.([A-Za-z0-9_.-]+)\.pt$")
_TEMPORARY = re.compile(r"^\.commit-.*\.tmp-(\d+)$")
_SLOT = re.compile(r"^slot-(\d+)-\d\.[A-Za-z0-9_.-]+\.pt$")


class CheckpointMismatchError(UnrecoverableStateError):
    """A snapshot or checkpoint holds a model or optimizer of another shape than this job's:
    refused before anything is loaded."""


class UnreadableCommitError(UnrecoverableStateError):
    """A file that is not a complete elasticrun commit (another format, a damaged one)."""


@dataclass(frozen=True)
class CommitFile:
    """A complete commit file: where it is, which commit, what part of the state."""

    path: Path
    commit: int
    holding: str


def shard_holding(holding: str, index: int, count: int) -> str:
    """The holding of shard index `index` of `count` of a state held as `holding`."""
    return f"{holding}.shard{index}of{count}"


def parse_shard(holding: str) -> tuple[str, int, int] | None:
    """(the state's holding, shard index, shard count) of a shard's holding; None if whole."""
    match = _SHARD.match(holding)
    return None if match is None else (match.group(1), int(match.group(2)),
                                       int(match.group(3)))


def kept_commits(holding: str) -> int:
    """How many complete commits of one holding are kept: two of a shard's."""
    return 2 if parse_shard(holding) is not None else 1


def file_name(commit: int, holding: str) -> str:
    return f"commit-{commit:012d}.{holding}.pt"


def payload(commit: int, holding: str, saved: Mapping[str, Any]) -> dict[str, Any]:
    """What a file holds, from a TorchState's saved copies (model, optimizer, objects)."""
    return {"format": FORMAT, "version": VERSION, "commit": commit, "holding": holding,
            "model": saved.get("model"), "optimizer": saved.get("optimizer"),
            "objects": saved.get("objects", {})}


def write(directory: Path, commit: int, holding: str, content: Mapping[str, Any],
          durable: bool) -> CommitFile:
    """Writes `content` as commit `commit`'s file in `directory`, atomically; `durable`:
    fsynced (file and directory) so that it survives a power loss."""
    final = directory / file_name(commit, holding)
    temporary = directory / f".{final.name}.tmp-{os.getpid()}"
    try:
        with open(temporary, "wb") as stream:
            torch.save(dict(content), stream)
            stream.flush()
            if durable:
                os.fsync(stream.fileno())
        os.chmod(temporary, 0o600)
        os.replace(temporary, final)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    if durable:
        _fsync_directory(directory)
    return CommitFile(final, commit, holding)


class SlotWriter:
    """Writes one process's commits into host memory in place: two slot files, used in
    turn, each overwritten where it is (a new tmpfs file's pages cost three times the copy
    itself), and published as `commit-N.<holding>.pt`, a symlink made at a temporary name
    and renamed, once the slot is complete. A published commit's slot is never the one being
    written: the older commit's link is removed as soon as the newer one is published. No
    CRC is computed (in memory it costs a third of the write; files for a disk have one)."""

    def __init__(self, directory: Path, kept: int | None = None) -> None:
        """`kept`: how many complete commits of a holding are kept (kept_commits()'s by
        default)."""
        self.directory = directory
        self.kept = kept
        self._turn = 0

    def write(self, commit: int, holding: str, content: Mapping[str, Any]) -> CommitFile:
        """(One slot more than the commits kept: the one written is never published.)"""
        slot = f"slot-{os.getpid()}-{self._turn}.{holding}.pt"
        path = self.directory / slot
        with open(path, "r+b" if path.exists() else "wb") as stream:
            with _without_crc():
                torch.save(dict(content), stream)
            stream.truncate()
        os.chmod(path, 0o600)
        final = self.directory / file_name(commit, holding)
        link = self.directory / f".{final.name}.tmp-{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        os.symlink(slot, link)
        os.replace(link, final)
        self._turn = (self._turn + 1) % ((self.kept or kept_commits(holding)) + 1)
        return CommitFile(final, commit, holding)


@contextlib.contextmanager
def _without_crc() -> Iterator[None]:
    # torch's setting is the process's: a torch.save of another thread meanwhile writes no
    # CRC either (torch.load checks none; only read() below does).
    config = serialization.config.save
    before = config.compute_crc32
    config.compute_crc32 = False
    try:
        yield
    finally:
        config.compute_crc32 = before


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def complete(directory: Path, holding: str | None = None) -> list[CommitFile]:
    """The complete commit files in `directory` (of one holding, or all), oldest first."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            match = _NAME.match(entry.name)
            if match and (holding is None or match.group(2) == holding):
                found.append(CommitFile(Path(entry.path), int(match.group(1)), match.group(2)))
    return sorted(found, key=lambda f: f.commit)


def newest(directory: Path, holding: str) -> CommitFile | None:
    files = complete(directory, holding)
    return files[-1] if files else None


def prune(directory: Path, keep: CommitFile, kept: int | None = None) -> None:
    """Removes `keep`'s older files of its holding (but the `kept` - 1 before it: by
    default one for a shard, none otherwise), and temporary files whose writer is gone
    (killed midway)."""
    older = [f for f in complete(directory, keep.holding) if f.commit < keep.commit]
    for old in older[:len(older) - (kept or kept_commits(keep.holding)) + 1]:
        if old.commit < keep.commit:
            with contextlib.suppress(OSError):
                old.path.unlink()
    with contextlib.suppress(OSError):
        linked = {os.readlink(f.path) for f in complete(directory) if f.path.is_symlink()}
        for entry in os.scandir(directory):
            match = _TEMPORARY.match(entry.name) or _SLOT.match(entry.name)
            if match and not alive(int(match.group(1))) and entry.name not in linked:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def alive(pid: int) -> bool:
    """Whether process `pid` exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read(path: Path) -> dict[str, Any]:
    """A commit file's content (tensors on the CPU)."""
    try:
        with zipfile.ZipFile(path) as archive:  # torch.load checks no CRC: a flipped bit
            checked = any(info.CRC for info in archive.infolist())  # would load silently
            damaged = archive.testzip() if checked else None  # (host snapshots have none)
        if damaged is not None:
            raise ValueError(f"record {damaged} is damaged (CRC-32)")
        content = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # torch.load fails in many ways on a file that is not whole
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnreadableCommitError(f"{path}: not a readable elasticrun commit ({first})") \
            from None
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        raise UnreadableCommitError(f"{path}: not an elasticrun commit file")
    if content.get("version") != VERSION:
        raise UnreadableCommitError(f"{path}: commit format version {content.get('version')}"
                                    f", this elasticrun reads version {VERSION}")
    return content


def load_checkpoint(path: str | os.PathLike[str], model: torch.nn.Module | None = None,
                    optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """Loads a commit that elasticrun kept (a file, or the newest complete one in a
    --checkpoint-dir) into `model` and `optimizer`, after checking that it fits them
    (CheckpointMismatchError, naming the first difference, and nothing loaded, if not).
    Returns the file's content: "objects" holds the other committed attributes (stateful
    ones as their state_dicts), "commit" the job's commit number."""
    where = Path(path)
    if where.is_dir():
        found = newest(where, WHOLE)
        if found is None:
            raise FileNotFoundError(f"{where}: no complete elasticrun commit in it")
        where = found.path
    content = read(where)
    problem = mismatch(content, None if model is None else model.state_dict(), optimizer)
    if problem is not None:
        raise CheckpointMismatchError(f"{where}: {problem}")
    if model is not None:
        model.load_state_dict(content["model"])
    if optimizer is not None:
        optimizer.load_state_dict(content["optimizer"])
    return content
