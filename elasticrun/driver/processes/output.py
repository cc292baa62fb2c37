"""Worker output: each line forwarded as `[rank]<stdout>:line` (elasticrun's own form) or as
torchrun writes it (its form: a teed line `[default0]:line`, or as
TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE says; any other line as the worker wrote it),
optionally to per-rank files.

--output-filename's per-rank files (`DIR/rank.N/stdout|stderr`) are opened for appending,
so a rank that is respawned or renumbered adds to its file and never overwrites it.

torchrun's --log-dir, --redirects, --tee and --local-ranks-filter (WorkerLogs): a stream of
a local rank that --redirects or --tee names is kept in torchrun's layout,
`LOG_DIR/<run id>_<random>/attempt_<restart count>/<local rank>/stdout.log|stderr.log`
(beside the worker's error.json); with several nodes, the hosting node keeps every node's
under `<node name>/` first. A redirected stream (not also teed) leaves the console; the
filter limits the console to the local ranks it names. Files keep everything.
"""

from __future__ import annotations

import asyncio
import datetime
import string
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from elasticrun.job.config import TorchrunSettings

CHUNK = 64 * 1024
STDERR_TAIL_LINES = 20
EVERY_LOCAL_RANK = -1  # a redirects/tee entry for every local rank (torchrun's "-r 3")
Streams = tuple[tuple[int, tuple[str, ...]], ...]  # local rank -> streams


def new_run_directory(log_dir: Path, run_id: str) -> Path:
    """A new directory for one run's files under --log-dir, `<run id>_<random>` (torchrun's:
    the same directory serves many runs)."""
    name = run_id.replace("/", "_")
    log_dir.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{name if name not in ('.', '..') else '_'}_",
                                 dir=log_dir))


def attempt_directory(run_dir: Path, node: str | None, attempt: int, local_rank: int) -> Path:
    """Where one worker's files go in torchrun's layout (`node`: with several nodes)."""
    base = run_dir / node if node is not None else run_dir
    return base / f"attempt_{attempt}" / str(local_rank)


@dataclass(frozen=True)
class WorkerLogs:
    """Which streams of which local ranks are kept in files and which reach the console,
    as torchrun's --redirects, --tee and --local-ranks-filter say."""

    root: Path | None  # --log-dir; a run's files go to root/<run id>
    redirects: Streams = ()  # kept in files, off the console
    tee: Streams = ()  # kept in files, and on the console
    local_ranks_filter: frozenset[int] | None = None  # None: every local rank's console
    line_prefix: str | None = None  # TorchrunSettings.line_prefix
    role: str = "default"
    by_node: bool = False  # several nodes: each node's files under its name
    _headers: dict[tuple[int, int, str], bytes] = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, settings: TorchrunSettings) -> WorkerLogs | None:
        """None when the settings ask for nothing beyond elasticrun's own console."""
        if settings.line_prefix is None and not (
                settings.redirects or settings.tee or settings.local_ranks_filter is not None):
            return None
        return cls(settings.log_dir, settings.redirects, settings.tee,
                   settings.local_ranks_filter, settings.line_prefix, settings.role,
                   settings.nodes_of is not None)

    def header(self, rank: int, local_rank: int, stream: str) -> bytes:
        """What a console line of this stream starts with: torchrun's (its form), teed
        lines only; elasticrun's own `[rank]<stream>:` otherwise."""
        if self.line_prefix is None:
            return f"[{rank}]<{stream}>:".encode()
        if stream not in _streams(self.tee, local_rank):
            return b""
        key = (rank, local_rank, stream)
        if key not in self._headers:
            self._headers[key] = string.Template(self.line_prefix).safe_substitute(
                role_name=self.role, rank=rank, local_rank=local_rank).encode()
        return self._headers[key]

    def kept(self, local_rank: int, stream: str) -> bool:
        return self.root is not None and (stream in _streams(self.redirects, local_rank)
                                          or stream in _streams(self.tee, local_rank))

    def shown(self, local_rank: int, stream: str) -> bool:
        if self.local_ranks_filter is not None and local_rank not in self.local_ranks_filter:
            return False
        return (stream not in _streams(self.redirects, local_rank)
                or stream in _streams(self.tee, local_rank))


def _streams(table: Streams, local_rank: int) -> tuple[str, ...]:
    """A local rank's entry, else the entry for every local rank, else none."""
    every: tuple[str, ...] = ()
    for rank, streams in table:
        if rank == local_rank:
            return streams
        if rank == EVERY_LOCAL_RANK:
            every = streams
    return every


class OutputRouter:
    def __init__(
        self,
        terminal_out: BinaryIO,
        terminal_err: BinaryIO,
        output_dir: Path | None = None,
        timestamps: bool = False,
        logs: WorkerLogs | None = None,
    ) -> None:
        self._terminal = {"stdout": terminal_out, "stderr": terminal_err}
        self._output_dir = output_dir
        self._timestamps = timestamps
        self._logs = logs
        self.run_dir: Path | None = None  # LOG_DIR/<run id>_<random>, once named
        self._files: dict[Path, BinaryIO] = {}

    def name_run(self, run_id: str) -> None:
        """The run whose files --log-dir keeps: a new directory for it (OSError)."""
        if self._logs is not None and self._logs.root is not None:
            self.run_dir = new_run_directory(self._logs.root, run_id)

    async def pump(
        self,
        reader: asyncio.StreamReader,
        stream: str,
        rank_of: Callable[[], int],
        tail: deque[str] | None = None,
        local_rank: int = EVERY_LOCAL_RANK,
        place: tuple[str, int] = ("", 0),
    ) -> None:
        """Forwards `reader` line by line until EOF. Partial last lines are forwarded too.
        `place`: the worker's host and restart count (where --log-dir keeps its files)."""
        pending = b""
        while True:
            chunk = await reader.read(CHUNK)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if lines:
                self._emit(lines, stream, rank_of(), tail, local_rank, place)
        if pending:
            self._emit([pending], stream, rank_of(), tail, local_rank, place)

    def _emit(self, lines: list[bytes], stream: str, rank: int, tail: deque[str] | None,
              local_rank: int = EVERY_LOCAL_RANK, place: tuple[str, int] = ("", 0)) -> None:
        stamp = b""
        if self._timestamps:
            stamp = datetime.datetime.now().isoformat(timespec="microseconds").encode() + b" "
        if self._logs is None or self._logs.shown(local_rank, stream):
            header = self._logs.header(rank, local_rank, stream) if self._logs is not None \
                else f"[{rank}]<{stream}>:".encode()
            prefix = stamp + header
            terminal = self._terminal[stream]
            terminal.write(b"".join(prefix + line + b"\n" for line in lines))
            terminal.flush()
        for path in self._paths(rank, local_rank, stream, place):
            file = self._file(path)
            file.write(b"".join(stamp + line + b"\n" for line in lines))
            file.flush()
        if tail is not None:
            tail.extend(line.decode(errors="replace").rstrip("\r") for line in lines)

    def _paths(self, rank: int, local_rank: int, stream: str, place: tuple[str, int]
               ) -> list[Path]:
        """The files this stream of this worker goes to: --output-filename's, --log-dir's."""
        found = [self._output_dir / f"rank.{rank}" / stream] if self._output_dir else []
        logs = self._logs
        if logs is not None and self.run_dir is not None and logs.kept(local_rank, stream):
            host, attempt = place
            found.append(attempt_directory(self.run_dir, host if logs.by_node else None,
                                           attempt, local_rank) / f"{stream}.log")
        return found

    def _file(self, path: Path) -> BinaryIO:
        if path not in self._files:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._files[path] = open(path, "ab")  # noqa: SIM115 - kept open
        return self._files[path]

    def close(self) -> None:
        for file in self._files.values():
            file.close()
        self._files.clear()


def new_tail() -> deque[str]:
    return deque(maxlen=STDERR_TAIL_LINES)
