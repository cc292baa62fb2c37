"""Fence, then take over: what a resumed driver does about the driver the journal names.

Two drivers must never run one job. The journal names the last driver's pid and the wall
clock of its last snapshot, which a live driver refreshes every second or so even when
nothing happens (its heartbeat). On the same host, the resumed driver looks at that pid:

- gone, or reused by a process that is no elasticrun: nothing to fence, take over;
- stopped (SIGSTOP, a debugger): it would wake up in a job it no longer owns, and still
  holds the port: it is killed first (Slurm's and Pacemaker's "fence, then take over");
- running with a fresh heartbeat: the job has a driver; refused, with one line;
- running with a stale heartbeat (hung, or its disk is gone): killed first, as stopped.

A driver on another host cannot be looked at from here; the epoch fences it instead: every
worker it talks to already heard the newer epoch and refuses it (server/signing.py).

`decide` is pure; `look` reads /proc.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

# A live driver rewrites the journal at least this often (journal/writer.py's heartbeat).
HEARTBEAT_S = 1.0
# A heartbeat older than this, from a driver whose process still runs: it is hung.
STALE_AFTER_S = 10.0


class OldDriverState(Enum):
    GONE = "gone"  # no such process, or not an elasticrun driver (its pid was reused)
    STOPPED = "stopped"
    RUNNING = "running"


@dataclass(frozen=True)
class OldDriver:
    pid: int
    state: OldDriverState
    heartbeat_age_s: float  # now minus the wall clock of its last snapshot


@dataclass(frozen=True)
class TakeOver:
    pass


@dataclass(frozen=True)
class FenceFirst:
    pid: int
    why: str


@dataclass(frozen=True)
class Refuse:
    reason: str


Fencing = TakeOver | FenceFirst | Refuse


def decide(old: OldDriver, own_pid: int, stale_after: float = STALE_AFTER_S) -> Fencing:
    if old.state is OldDriverState.GONE or old.pid == own_pid:
        return TakeOver()
    if old.state is OldDriverState.STOPPED:
        return FenceFirst(old.pid, "it is stopped, and would wake up in a job it no longer "
                                   "owns")
    if old.heartbeat_age_s < stale_after:
        return Refuse(f"the job's driver (pid {old.pid}) is still running (its journal was "
                      f"written {max(old.heartbeat_age_s, 0.0):.1f}s ago); stop it first, or "
                      f"resume once it is gone")
    return FenceFirst(old.pid, f"it still runs but has not written its journal for "
                               f"{old.heartbeat_age_s:.0f}s (hung)")


def look(pid: int, heartbeat_age_s: float, proc: Path = Path("/proc")) -> OldDriver:
    """The journal's driver as this host sees it."""
    try:
        cmdline = (proc / str(pid) / "cmdline").read_bytes()
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return OldDriver(pid, OldDriverState.GONE, heartbeat_age_s)
    if not _is_driver(cmdline):
        return OldDriver(pid, OldDriverState.GONE, heartbeat_age_s)
    fields = stat.rsplit(")", 1)[-1].split()
    code = fields[0] if fields else "?"
    if code in ("Z", "X"):  # exited, not yet reaped: it holds nothing
        return OldDriver(pid, OldDriverState.GONE, heartbeat_age_s)
    state = OldDriverState.STOPPED if code in ("T", "t") else OldDriverState.RUNNING
    return OldDriver(pid, state, heartbeat_age_s)


def _is_driver(cmdline: bytes) -> bool:
    """`elasticrun ...` (its console script) or `python -m elasticrun ...`."""
    return any(os.path.basename(arg) == b"elasticrun" for arg in cmdline.split(b"\0"))
