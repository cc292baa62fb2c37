"""The restart benchmark's view of a running job (benchmarks/restart.py): its output read
line by line and stamped as it comes, and its processes as /proc shows them (workers, their
start times, when old ones are gone, when new ones appear)."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from benchlib import TAG_VAR, kill_tagged, tagged_pids

TEMPLATE = "elasticrun.worker.template"  # in the cmdline of the template and its forks
TORCHRUN = "torch.distributed.run"
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


# --- a running job ----------------------------------------------------------------------
class Job:
    """A launcher in its own session, its output (stdout and stderr) read line by line and
    each line stamped with time.time() when read; every process carrying its tag is gone
    when the block ends."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str]) -> None:
        self.tag = uuid.uuid4().hex
        self.lines: list[tuple[float, str]] = []
        self.proc = subprocess.Popen(list(command), env={**env, TAG_VAR: self.tag},
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def wait_for(self, pattern: re.Pattern[str], timeout: float, what: str,
                 accept: Callable[[float, re.Match[str]], bool] = lambda t, m: True
                 ) -> tuple[float, re.Match[str]]:
        """The first line (read time, match) that matches and is accepted."""
        deadline, seen = time.monotonic() + timeout, 0
        while True:
            lines = self.lines[seen:]
            for stamp, line in lines:
                if (match := pattern.search(line)) and accept(stamp, match):
                    return stamp, match
            seen += len(lines)
            if self.proc.poll() is not None and not self._reader.is_alive():
                raise RuntimeError(f"{what}: the job ended first (exit {self.proc.returncode})"
                                   f": {self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not within {timeout:g}s: {self.tail()}")
            time.sleep(0.01)

    def ended(self, timeout: float) -> str:
        """How the launcher ended: "ok" (exit 0), "exit N", or "hung" (still running after
        `timeout` seconds; the block's end stops it)."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return "hung"
        self._reader.join(5)
        return "ok" if code == 0 else f"exit {code}"

    def tail(self, count: int = 6) -> str:
        return " | ".join(line.strip()[:200] for _, line in self.lines[-count:])

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # both launchers then stop the workers they started
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        kill_tagged(self.tag)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(15)
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# --- processes ----------------------------------------------------------------------------
def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields from the state on (field 3), or None when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def workers(tag: str, launcher: str, script: Path) -> list[int]:
    """The job's worker processes: forked by elasticrun's template (whose environment they
    show, tag included), or started by torchrun's agent."""
    found = []
    for pid in tagged_pids(tag):
        stat = stat_fields(pid)
        if stat is None or stat[0] in "ZX":
            continue
        parent, own = cmdline(int(stat[1])), cmdline(pid)
        if launcher == "elasticrun":
            if TEMPLATE in parent and TEMPLATE in own:
                found.append(pid)
        elif TORCHRUN in parent and str(script) in own:
            found.append(pid)
    return sorted(found)


def started_at(pid: int) -> float | None:
    """The process's start (time.time() scale, to a clock tick): /proc's start time counts
    ticks since boot."""
    stat = stat_fields(pid)
    if stat is None:
        return None
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME) - int(stat[19]) * TICK_S
    return time.time() - since_boot


def parent_of(pids: Sequence[int]) -> int:
    """The one process that started all of `pids`."""
    parents = {int(stat[1]) for pid in pids if (stat := stat_fields(pid)) is not None}
    if len(parents) != 1:
        raise RuntimeError(f"workers {list(pids)} have parents {parents}, expected one")
    return parents.pop()


def wait_gone(pids: Sequence[int], timeout: float) -> float:
    """When the last of `pids` was gone (exited, or a zombie not reaped yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all((stat := stat_fields(pid)) is None or stat[0] in "ZX" for pid in pids):
            return time.time()
        time.sleep(0.005)
    raise RuntimeError(f"the old workers {list(pids)} were not gone within {timeout:g}s")


def children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := stat_fields(int(entry))) is not None \
                and stat[1] == str(parent) and stat[0] not in "ZX":
            found.append(int(entry))
    return found


def spawned_at(parent: int, old: Sequence[int], timeout: float) -> float:
    """When the first of the restarted job's workers (new children of `parent`: the
    template, or torchrun's agent) started. Looked for every 50 ms (a scan of /proc costs
    ~4 ms of CPU); the start time itself is the kernel's."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        starts = [started_at(pid) for pid in children(parent) if pid not in old]
        if known := [start for start in starts if start is not None]:
            return min(known)
        time.sleep(0.05)
    raise RuntimeError(f"no new worker of process {parent} within {timeout:g}s")
