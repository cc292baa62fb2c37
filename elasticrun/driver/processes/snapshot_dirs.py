"""Where each host keeps the snapshots of a job's commits, and their removal at the job's end.

Host memory (/dev/shm, a tmpfs) outlives every worker process of the host, not the host;
the directory is named by the job's id, which a resumed driver keeps, so that a driver
restarted after losing every worker finds them. When the job ends, the driver removes this
machine's directory, `elasticrun agent` its host's, the SSH launcher's worker template its
host's (when it ends). A driver killed outright leaves them for a --resume.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

SHARED_MEMORY = Path("/dev/shm")
_JOB_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def snapshot_directory(job_id: str) -> Path:
    if not _JOB_ID.match(job_id):
        raise ValueError(f"job id {job_id!r}: expected letters, digits, '-' or '_'")
    base = SHARED_MEMORY if SHARED_MEMORY.is_dir() else Path("/tmp")
    return base / f"elasticrun-{os.getuid()}-{job_id}"


def remove(directory: Path) -> None:
    """Removes a job's snapshot directory on this machine (nothing if there is none)."""
    with contextlib.suppress(OSError):
        shutil.rmtree(directory)
