"""The stragglers benchmark's jobs (benchmarks/stragglers.py): what each run is (its
timings, the slowed worker's cases, the flags) and a paced script running under elasticrun,
seen through its step lines, its event log and the control files that pace its workers.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib import REPO, Tail, bench_env, elasticrun_command, read_events
from restart_jobs import Job, stat_fields, workers

PACED = REPO / "tests" / "integration" / "scripts"
TRAIN_SCRIPT = PACED / "paced_train.py"
DDP_SCRIPT = PACED / "paced_ddp.py"
HOSTS = "localhost:2,127.0.0.1:2"
SIZE = 4
EVICT_FLAGS = ("--min-np", "2", "--blacklist-cooldown-range", "600", "600")
STEP_S = 0.1  # the scripts' default "device time" per step
COST_STEP_S = 0.02
START_TIMEOUT_S = 180.0  # launch -> rank 0's first step
EXIT_WAIT_S = 30.0  # stop -> the launcher's exit; longer: "hung"
COST_MODES = ("off", "report")

# "step N rank R size W [host H pid P] t=T", after elasticrun's "[rank]<stdout>:" prefix
STEP = re.compile(r"step (\d+) rank (\d+) size (\d+)(?: host \S+ pid \d+)? t=([\d.]+)")


@dataclass(frozen=True)
class Timing:
    """How long each part's runs last (seconds)."""

    steady_s: float  # training before the slowdown
    after_s: float  # kept on after the eviction
    hold_s: float  # after the slowdown when nobody is evicted
    cost_s: float  # each cost run
    quiet_s: float  # the false-alarm run
    pause_at_s: float  # its one-off pause of one worker
    slow_all_at_s: float  # its job-wide slowdown
    slow_all_s: float = 15.0
    pause_s: float = 4.0
    slow_all: float = 3.0


FULL = Timing(steady_s=8, after_s=15, hold_s=40, cost_s=20, quiet_s=60, pause_at_s=10,
              slow_all_at_s=25)
QUICK = Timing(steady_s=4, after_s=5, hold_s=25, cost_s=6, quiet_s=18, pause_at_s=2,
               slow_all_at_s=7, slow_all_s=10)


@dataclass(frozen=True)
class Case:
    """One slowed worker: its factor, the script, the --stragglers mode."""

    factor: float
    script: Path
    mode: str

    @property
    def key(self) -> str:
        return f"{'ddp-' if self.script == DDP_SCRIPT else ''}{self.factor:g}x"

    @property
    def detect_only(self) -> bool:
        return self.mode != "evict"


def cases(quick: bool) -> list[Case]:
    """Quick: the 5x case alone (the torchrun-style one is tests/integration's too)."""
    if quick:
        return [Case(5.0, TRAIN_SCRIPT, "evict")]
    return [*(Case(f, TRAIN_SCRIPT, "evict") for f in (1.5, 2.0, 5.0)),
            Case(5.0, DDP_SCRIPT, "report")]


# --- a paced job --------------------------------------------------------------------------
class PacedJob:
    """A paced script under elasticrun: its step lines, its events, its control files."""

    def __init__(self, tmp: Path, script: Path, mode: str, step_s: float = STEP_S) -> None:
        self.script = script
        self.control = tmp / "control"
        self.control.mkdir()
        self.events = tmp / "events.jsonl"
        self._tail = Tail(self.events)
        self._seen: list[dict[str, Any]] = []
        flags = ["-np", str(SIZE), "-H", HOSTS, "--event-log", str(self.events),
                 "--stragglers", mode, *(EVICT_FLAGS if mode == "evict" else ())]
        self.job = Job([*elasticrun_command(flags, script), "--control", str(self.control),
                        "--step-s", f"{step_s:g}"], bench_env({"PYTHONUNBUFFERED": "1"}))

    def __enter__(self) -> PacedJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.job.__exit__(*exc)

    def started(self) -> float:
        """The time of rank 0's first step."""
        _, match = self.job.wait_for(STEP, START_TIMEOUT_S, "the first step",
                                     lambda t, m: m.group(2) == "0")
        return float(match.group(4))

    def victim(self) -> int:
        """The newest worker (in practice rank 3, on 127.0.0.1)."""
        found = workers(self.job.tag, "elasticrun", self.script)
        if len(found) != SIZE:
            raise RuntimeError(f"found workers {found}, expected {SIZE}: {self.job.tail()}")
        return found[-1]

    def write(self, name: str, text: str = "") -> float:
        """A control file written whole (the workers read it at every step); its time."""
        part = self.control / f".{name}.part"
        part.write_text(text)
        os.replace(part, self.control / name)
        return time.time()

    def remove(self, name: str) -> None:
        (self.control / name).unlink(missing_ok=True)

    def wait_event(self, kind: str, after: float, until: float) -> dict[str, Any] | None:
        """The first event `kind` later than `after`, waited for up to time `until`
        (time.time()); None if none came by then."""
        while True:
            self._seen += self._tail.read()
            found = [e for e in self._seen if e["type"] == kind and e["time"] > after]
            if found:
                return found[0]
            if self.job.proc.poll() is not None:
                raise RuntimeError(f"the job ended waiting for {kind}: {self.job.tail()}")
            if time.time() > until:
                return None
            time.sleep(0.1)

    def stop(self) -> str:
        """Training ended (DIR/stop); how the launcher ends ("ok", "exit N", "hung")."""
        self.write("stop")
        return self.job.ended(EXIT_WAIT_S)

    def steps(self) -> list[tuple[int, int, float]]:
        """(rank, size, time) of every step line."""
        return [(int(m.group(2)), int(m.group(3)), float(m.group(4)))
                for _, line in list(self.job.lines) if (m := STEP.search(line))]

    def rate(self, start: float, end: float, size: int | None = None) -> float | None:
        """Rank 0's steps a second between the two times (at world `size`); None with
        fewer than 3 steps there."""
        times = [t for rank, n, t in self.steps()
                 if rank == 0 and start <= t <= end and size in (None, n)]
        return (len(times) - 1) / (times[-1] - times[0]) if len(times) >= 3 else None

    def count(self, kind: str) -> int:
        return sum(1 for e in read_events(self.events) if e["type"] == kind)


def sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.time()))


def gone(pid: int) -> bool:
    stat = stat_fields(pid)
    return stat is None or stat[0] in "ZX"
