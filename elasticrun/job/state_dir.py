"""Small files a job keeps in its --state-dir: the directory 0700, each file 0600 (they may
hold the job's secrets). The journal's snapshots have their own writer (journal/files.py)."""

from __future__ import annotations

import os
from pathlib import Path

from elasticrun.job.errors import ConfigError


def write_private(directory: Path, name: str, text: str) -> None:
    """Writes `text` to DIRECTORY/NAME (0600), making the directory (0700) if missing;
    ConfigError (one line) when it cannot."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        descriptor = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
    except OSError as exc:
        raise ConfigError(f"--state-dir {directory}: cannot write there: "
                          f"{exc.strerror or exc}") from None
