"""Setting up a process that runs elasticrun's driver or an agent: its log lines and its
open-file limit. The `elasticrun` command, `elasticrun agent` and `elasticrun.run` share it.
"""

from __future__ import annotations

import contextlib
import logging
import resource
import sys


class LogFormatter(logging.Formatter):
    """`PREFIX: message`, with the level named unless it is INFO."""

    def __init__(self, prefix: str = "elasticrun") -> None:
        super().__init__()
        self._prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        return f"{self._prefix}: {level}{record.getMessage()}"


def setup_logging(level: str, prefix: str = "elasticrun") -> None:
    """elasticrun's log lines to stderr at `level`, for a process elasticrun owns (its CLI)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogFormatter(prefix))
    root = logging.getLogger("elasticrun")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def raise_open_file_limit() -> None:
    """Every worker holds connections and pipes; a crowd of idle clients must not use up
    the driver's descriptors either. Soft limit up to the hard one (no privilege needed)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
