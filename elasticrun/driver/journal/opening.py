"""A new job's journal (--state-dir): its directory, the job's secret, the first snapshot.

The secret lives in its own 0600 file beside the snapshots, which name it (never hold it);
the journal's first snapshot is on disk before any worker starts. A directory whose journal
names a driver still running on this host is that job's: a new job refuses it (a second
journal over the first would leave the first job's restart nothing to resume).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticrun.driver.journal import codec, fencing
from elasticrun.driver.journal.files import JournalError, JournalFiles
from elasticrun.driver.journal.writer import JournalWriter
from elasticrun.driver.rounds.state import JobState
from elasticrun.job.state_dir import write_private

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


def refuse_a_running_job(directory: Path) -> None:
    """JournalError (one line) when `directory`'s journal names a driver that is still
    running here (or stopped, or hung): not a place for a new job."""
    try:
        job = JournalFiles(directory).read().body.get("job") or {}
        pid, written_at = int(job["driver_pid"]), float(job["written_at"])
    except (JournalError, KeyError, TypeError, ValueError):
        return  # no journal (or none a driver could resume): the directory is free
    old = fencing.look(pid, time.time() - written_at)
    if old.state is not fencing.OldDriverState.GONE and pid != os.getpid():
        raise JournalError(f"--state-dir {directory}: job {job.get('id')}'s driver (pid {pid}) "
                           f"is still running with it; give this job a directory of its "
                           f"own, or --resume to take that job over once its driver is gone")


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
