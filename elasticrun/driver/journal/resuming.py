"""Reading a job back for --resume: its record, its secret and the machine's state.

Everything wrong with the directory is one line (JournalError): no snapshot, a corrupt one
with no valid predecessor, a missing secret, a body this version did not write, a job that
had ended.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from elasticrun.driver.hosts.registry import HostRegistry
from elasticrun.driver.journal import codec
from elasticrun.driver.journal.files import JournalError, JournalFiles
from elasticrun.driver.journal.opening import SECRET_FILE, JobRecord
from elasticrun.driver.rounds.state import JobPhase, JobState


@dataclass(frozen=True)
class Resumed:
    job: JobRecord
    written_at: float  # wall clock of the snapshot: the old driver's last heartbeat
    secret: str
    state: JobState
    source: str  # which snapshot file it came from ("new", "current", "previous")


def load(directory: Path, hosts: HostRegistry, now: float | None = None,
         wall: float | None = None) -> Resumed:
    """The job kept in `directory`, its state taken into `hosts` and the clock of now."""
    now = time.monotonic() if now is None else now
    wall = time.time() if wall is None else wall
    snapshot = JournalFiles(directory).read()
    body = snapshot.body
    try:
        kept = body["job"]
        job = JobRecord(str(kept["id"]), int(kept["epoch"]), int(kept["port"]),
                        tuple(str(arg) for arg in kept["command"]), int(kept["driver_pid"]))
        written_at = float(kept["written_at"])
        state = codec.decode(body["state"], hosts, now, wall)
    except (KeyError, TypeError, ValueError) as exc:
        raise JournalError(f"cannot resume from {directory}: its journal snapshot "
                           f"({snapshot.source}) is not one this elasticrun wrote: "
                           f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                           ) from None
    if state.phase is JobPhase.STOPPED:
        raise JournalError(f"cannot resume from {directory}: job {job.id} had already ended "
                           f"when its driver stopped")
    try:
        secret = (directory / kept.get("secret_file", SECRET_FILE)).read_text().strip()
    except OSError as exc:
        raise JournalError(f"cannot resume from {directory}: the job's secret file: "
                           f"{exc.strerror or exc}") from None
    if not secret:
        raise JournalError(f"cannot resume from {directory}: the job's secret file is empty")
    return Resumed(job, written_at, secret, state, snapshot.source)
