"""Worker output: each line forwarded as `[rank]<stdout>:line`, optionally to per-rank files.

Per-rank files (`DIR/rank.N/stdout|stderr`) are opened for appending, so a rank that
is respawned or renumbered adds to its file and never overwrites it.
"""

from __future__ import annotations

import asyncio
import datetime
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

CHUNK = 64 * 1024
STDERR_TAIL_LINES = 20


class OutputRouter:
    def __init__(
        self,
        terminal_out: BinaryIO,
        terminal_err: BinaryIO,
        output_dir: Path | None = None,
        timestamps: bool = False,
    ) -> None:
        self._terminal = {"stdout": terminal_out, "stderr": terminal_err}
        self._output_dir = output_dir
        self._timestamps = timestamps
        self._files: dict[tuple[int, str], BinaryIO] = {}

    async def pump(
        self,
        reader: asyncio.StreamReader,
        stream: str,
        rank_of: Callable[[], int],
        tail: deque[str] | None = None,
    ) -> None:
        """Forwards `reader` line by line until EOF. Partial last lines are forwarded too."""
        pending = b""
        while True:
            chunk = await reader.read(CHUNK)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if lines:
                self._emit(lines, stream, rank_of(), tail)
        if pending:
            self._emit([pending], stream, rank_of(), tail)

    def _emit(self, lines: list[bytes], stream: str, rank: int, tail: deque[str] | None) -> None:
        stamp = b""
        if self._timestamps:
            stamp = datetime.datetime.now().isoformat(timespec="microseconds").encode() + b" "
        prefix = stamp + f"[{rank}]<{stream}>:".encode()
        terminal = self._terminal[stream]
        terminal.write(b"".join(prefix + line + b"\n" for line in lines))
        terminal.flush()
        file = self._file(rank, stream)
        if file is not None:
            file.write(b"".join(stamp + line + b"\n" for line in lines))
            file.flush()
        if tail is not None:
            tail.extend(line.decode(errors="replace").rstrip("\r") for line in lines)

    def _file(self, rank: int, stream: str) -> BinaryIO | None:
        if self._output_dir is None:
            return None
        key = (rank, stream)
        if key not in self._files:
            directory = self._output_dir / f"rank.{rank}"
            directory.mkdir(parents=True, exist_ok=True)
            self._files[key] = open(directory / stream, "ab")  # noqa: SIM115 - kept open
        return self._files[key]

    def close(self) -> None:
        for file in self._files.values():
            file.close()
        self._files.clear()


def new_tail() -> deque[str]:
    return deque(maxlen=STDERR_TAIL_LINES)
