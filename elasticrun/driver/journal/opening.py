"""A new job's journal (--state-dir): its directory, the job's secret, the first snapshot.

The secret lives in its own 0600 file beside the snapshots, which name it (never hold it);
the journal's first snapshot is on disk before any worker starts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticrun.driver.journal import codec
from elasticrun.driver.journal.files import JournalFiles
from elasticrun.driver.journal.writer import JournalWriter
from elasticrun.driver.rounds.state import JobState
from elasticrun.state_dir import write_private

SECRET_FILE = "secret"


@dataclass(frozen=True)
class JobRecord:
    """What the journal keeps about the job besides the machine's state."""

    id: str
    epoch: int  # the driver's (fencing: server/signing.py)
    port: int  # the driver's server, where a resumed driver listens again
    command: tuple[str, ...]
    driver_pid: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "epoch": self.epoch, "port": self.port,
                "command": list(self.command), "driver_pid": self.driver_pid,
                "secret_file": SECRET_FILE}


async def open_journal(directory: Path, job: JobRecord, secret: str,
                       state: JobState) -> JournalWriter:
    """The journal of a job starting now: ConfigError (one line) if `directory` cannot
    hold it."""
    files = JournalFiles(directory)
    write_private(directory, SECRET_FILE, secret)
    record = job.to_json()
    writer = JournalWriter(files, lambda: {
        "job": {**record, "written_at": time.time()},
        "state": codec.encode(state, time.monotonic(), time.time())})
    await writer.flush()
    return writer
