"""Reading a job back for --resume: its record, its secret and the machine's state.

Everything wrong with the directory is one line (JournalError): no snapshot, a corrupt one
with no valid predecessor, a missing secret, a body this version did not write, a job that
had ended.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from elasticrun.driver.hosts.registry import HostRegistry
from elasticrun.driver.journal import codec, fencing
from elasticrun.driver.journal.files import JournalError, JournalFiles
from elasticrun.driver.journal.opening import SECRET_FILE, JobRecord
from elasticrun.driver.rounds.state import JobPhase, JobState

log = logging.getLogger("elasticrun.driver")

FENCE_WAIT_S = 5.0  # how long a fenced old driver gets to be gone after SIGKILL


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


def take_over(directory: Path, hosts: HostRegistry) -> Resumed:
    """Loads the job, then fences the driver the journal names (fencing.py): refused while
    it runs, killed first when it is stopped or hung. JournalError (one line) if not."""
    resumed = load(directory, hosts)
    old = fencing.look(resumed.job.driver_pid, time.time() - resumed.written_at)
    decision = fencing.decide(old, os.getpid())
    if isinstance(decision, fencing.Refuse):
        raise JournalError(f"cannot resume from {directory}: {decision.reason}")
    if isinstance(decision, fencing.FenceFirst):
        log.warning("the job's old driver (pid %d) is fenced first: %s", decision.pid,
                    decision.why)
        _kill_and_wait(directory, decision.pid, old.heartbeat_age_s)
    return resumed


def _kill_and_wait(directory: Path, pid: int, age: float) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + FENCE_WAIT_S
    while fencing.look(pid, age).state is not fencing.OldDriverState.GONE:
        if time.monotonic() > deadline:
            raise JournalError(f"cannot resume from {directory}: the old driver (pid {pid}) "
                               f"is still there {FENCE_WAIT_S:g}s after SIGKILL")
        time.sleep(0.05)
