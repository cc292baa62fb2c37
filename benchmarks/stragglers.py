"""Stragglers (fail-slow): how soon a slow worker is named, what evicting it gives back, what
the measurement costs, and whether anything else is named.

Every job: 4 workers on 2 loopback hosts,

    elasticrun -np 4 -H localhost:2,127.0.0.1:2 --event-log EVENTS --stragglers MODE
               [--min-np 2 --blacklist-cooldown-range 600 600] python SCRIPT --control DIR

SCRIPT is tests/integration/scripts/paced_train.py (an elasticrun.torch script, a commit
every step) or paced_ddp.py (an unmodified torchrun-style DDP loop); each step's "device
time" is a sleep of --step-s (0.1 s) that control files in DIR stretch
(paced_control.py: slow-<pid>, slow-all, pause-<pid>; DIR/stop ends training). Rates are
rank 0's steps a second, from the times its step lines carry.

1. Detection and eviction. After 8 s of training (quick: 4 s) the newest worker is made
   1.5x, 2x and 5x slower (slow-<pid>), under --stragglers evict --min-np 2 (the slot
   blacklisted for 600 s, so that it stays out for the run). Measured: slowdown -> the
   `straggler` event (detection), the event's slowdown, action and projected gain,
   slowdown -> the round at world size 3 (eviction), steps/s before the slowdown, while
   slowed (up to the eviction) and after it (world size 3, from its first step),
   after/while, and whether the evicted worker had exited by the end. The job is stopped
   15 s after the eviction (or 40 s after the slowdown without one; quick: 5 s, 25 s); it
   must exit 0.
2. The measurement's cost: the elasticrun.torch script at --step-s 0.02 and no slowdown,
   --stragglers off against --stragglers report, 20 s each (quick: 6 s), the order
   alternating per trial: steps/s (from the first step + 2 s to the stop) and report/off.
3. False alarms: --stragglers report, no worker slowed; one worker paused once for 4 s
   (pause-<pid>), then every worker 3x slower for 15 s (slow-all; 10 s in quick mode, still
   longer than the detection's window): `straggler` and `straggler_cleared` events (0
   expected).
4. The torchrun-style script (paced_ddp.py), one worker 5x slower, --stragglers report:
   detection only (the job is stopped soon after the event).

Quick mode: the 5x case of 1 alone (not 4: tests/integration/test_stragglers.py runs it),
shorter runs, one trial.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchlib import REPO, Tail, bench_env, elasticrun_command, median, print_table, read_events
from restart_jobs import Job, stat_fields, workers

PACED = REPO / "tests" / "integration" / "scripts"
TRAIN_SCRIPT = PACED / "paced_train.py"
DDP_SCRIPT = PACED / "paced_ddp.py"
HOSTS = "localhost:2,127.0.0.1:2"
SIZE = 4
EVICT_FLAGS = ("--min-np", "2", "--blacklist-cooldown-range", "600", "600")
STEP_S = 0.1  # the scripts' default "device time" per step
COST_STEP_S = 0.02
WARM_S = 2.0  # the cost runs' first seconds, left out of their rate
START_TIMEOUT_S = 180.0  # launch -> rank 0's first step
ROUND_TIMEOUT_S = 60.0  # eviction -> the round at the smaller size
EXIT_WAIT_S = 30.0  # stop -> the launcher's exit; longer: "hung"
DETECTED_AFTER_S = 2.0  # a detection-only run goes on this long after its event
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


def ratio(top: float | None, bottom: float | None) -> float | None:
    return top / bottom if top is not None and bottom else None


# --- 1 and 4: detection and eviction ------------------------------------------------------
def detection_trial(case: Case, timing: Timing, tmp: Path) -> dict[str, Any]:
    with PacedJob(tmp, case.script, case.mode) as job:
        first = job.started()
        sleep_until(first + timing.steady_s)
        victim = job.victim()
        slowed = job.write(f"slow-{victim}", f"{case.factor:g}")
        named = job.wait_event("straggler", slowed, slowed + timing.hold_s)
        evicted = None
        if named is not None and named["data"]["action"] == "evicted":
            evicted = job.wait_event("round_started", named["time"],
                                     time.time() + ROUND_TIMEOUT_S)
        sleep_until(_stop_at(case, timing, slowed, named, evicted))
        victim_gone, end = gone(victim), time.time()
        ended = job.stop()
        rates = _rates(job, first, slowed, evicted, end)
    return {"factor": case.factor, "exit": ended, "victim_exited": victim_gone,
            **_named(named, slowed), **_evicted(evicted, slowed), **rates,
            "speedup": ratio(rates["after_steps_per_s"], rates["while_steps_per_s"])}


def _stop_at(case: Case, timing: Timing, slowed: float, named: dict[str, Any] | None,
             evicted: dict[str, Any] | None) -> float:
    """after_s after an eviction; soon after the event when only detection is measured;
    else hold_s after the slowdown (the straggler kept, or never named)."""
    if evicted is not None:
        return float(evicted["time"]) + timing.after_s
    if case.detect_only and named is not None:
        return float(named["time"]) + DETECTED_AFTER_S
    return slowed + timing.hold_s


def _named(named: dict[str, Any] | None, slowed: float) -> dict[str, Any]:
    if named is None:
        return {"detected": False, "detection_s": None, "slowdown": None, "action": "none",
                "reason": "", "projected_gain": None, "rank": None, "host": None}
    data = named["data"]
    return {"detected": True, "detection_s": named["time"] - slowed,
            "slowdown": data["slowdown"], "action": data["action"], "reason": data["reason"],
            "projected_gain": data["projected_gain"], "rank": data["rank"],
            "host": data["host"]}


def _evicted(evicted: dict[str, Any] | None, slowed: float) -> dict[str, Any]:
    if evicted is None:
        return {"eviction_s": None, "size_after": SIZE}
    return {"eviction_s": evicted["time"] - slowed, "size_after": evicted["data"]["world_size"]}


def _rates(job: PacedJob, first: float, slowed: float, evicted: dict[str, Any] | None,
           end: float) -> dict[str, float | None]:
    """Steps/s before the slowdown (its first second left out), while slowed (at the full
    size), and after the eviction (at the smaller size)."""
    after = None
    if evicted is not None:
        after = job.rate(evicted["time"], end, evicted["data"]["world_size"])
    return {"before_steps_per_s": job.rate(first + 1.0, slowed),
            "while_steps_per_s": job.rate(slowed, end, SIZE),
            "after_steps_per_s": after}


def run_detection(case: Case, timing: Timing, trials: int) -> list[dict[str, Any]]:
    found = []
    for _ in range(trials):
        with tempfile.TemporaryDirectory() as tmp:
            found.append(detection_trial(case, timing, Path(tmp)))
    return found


# --- 2: the measurement's cost ------------------------------------------------------------
def cost_trial(mode: str, timing: Timing, tmp: Path) -> dict[str, Any]:
    with PacedJob(tmp, TRAIN_SCRIPT, mode, COST_STEP_S) as job:
        first = job.started()
        sleep_until(first + timing.cost_s)
        end = time.time()
        ended = job.stop()
        return {"mode": mode, "exit": ended, "steps_per_s": job.rate(first + WARM_S, end),
                "stragglers": job.count("straggler")}


def run_cost(timing: Timing, trials: int) -> list[dict[str, Any]]:
    """Pairs of runs, every other trial in the other order."""
    found = []
    for trial in range(trials):
        order = COST_MODES if trial % 2 == 0 else COST_MODES[::-1]
        pair = {}
        for mode in order:
            with tempfile.TemporaryDirectory() as tmp:
                pair[mode] = cost_trial(mode, timing, Path(tmp))
        found.append({**pair, "ratio": ratio(pair["report"]["steps_per_s"],
                                             pair["off"]["steps_per_s"])})
    return found


# --- 3: false alarms ----------------------------------------------------------------------
def quiet_trial(timing: Timing, tmp: Path) -> dict[str, Any]:
    with PacedJob(tmp, TRAIN_SCRIPT, "report") as job:
        first = job.started()
        victim = job.victim()
        sleep_until(first + timing.pause_at_s)
        job.write(f"pause-{victim}", f"{timing.pause_s:g}")
        sleep_until(first + timing.slow_all_at_s)
        job.write("slow-all", f"{timing.slow_all:g}")
        sleep_until(first + timing.slow_all_at_s + timing.slow_all_s)
        job.remove("slow-all")
        paused = not (job.control / f"pause-{victim}").exists()  # taken (and removed)
        sleep_until(first + timing.quiet_s)
        ended = job.stop()
        return {"exit": ended, "run_s": timing.quiet_s, "pause_taken": paused,
                "stragglers": job.count("straggler"),
                "cleared": job.count("straggler_cleared"),
                "steps_per_s": job.rate(first + 1.0, first + timing.quiet_s)}


def run_quiet(timing: Timing, trials: int) -> list[dict[str, Any]]:
    found = []
    for _ in range(trials):
        with tempfile.TemporaryDirectory() as tmp:
            found.append(quiet_trial(timing, Path(tmp)))
    return found


# --- summaries and tables -----------------------------------------------------------------
def middle(trials: Sequence[dict[str, Any]], key: str) -> float | None:
    """The median of a key over the trials that have a number for it."""
    values = [t[key] for t in trials if isinstance(t.get(key), (int, float))
              and not isinstance(t.get(key), bool)]
    return median(values) if values else None


def tally(trials: Sequence[dict[str, Any]], key: str) -> str:
    """A key's values and how many trials had each: "evicted" or "kept x1, evicted x2"."""
    counts = Counter(str(t[key]) for t in trials)
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{value} x{n}" for value, n in sorted(counts.items()))


DETECTION_KEYS = ("detection_s", "slowdown", "projected_gain", "eviction_s",
                  "before_steps_per_s", "while_steps_per_s", "after_steps_per_s", "speedup")


def detection_summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    return {"detected": sum(t["detected"] for t in trials), "trials": len(trials),
            "action": tally(trials, "action"), "exit": tally(trials, "exit"),
            **{key: middle(trials, key) for key in DETECTION_KEYS}}


def _number(value: float | None) -> float | str:
    return "-" if value is None else value


def detection_rows(results: dict[str, dict[str, Any]], all_cases: list[Case]
                   ) -> list[list[Any]]:
    rows = []
    for case in all_cases:
        s = results[case.key]["summary"]
        rows.append([f"{case.factor:g}x", case.script.name, case.mode,
                     f"{s['detected']}/{s['trials']}", *(
                         _number(s[k]) for k in DETECTION_KEYS[:4]), s["action"],
                     *(_number(s[k]) for k in DETECTION_KEYS[4:]), s["exit"]])
    return rows


def print_detection(results: dict[str, dict[str, Any]], all_cases: list[Case],
                    timing: Timing, trials: int) -> None:
    print_table(f"stragglers: one of 4 workers (2 hosts x 2 on loopback) slowed after "
                f"{timing.steady_s:g} s of training (--step-s {STEP_S:g}); --stragglers "
                f"evict {' '.join(EVICT_FLAGS)} (DDP: report); median of {trials}",
                ["slowed", "script", "mode", "detected", "detect s", "slowdown", "gain",
                 "evict s", "action", "before st/s", "while st/s", "after st/s",
                 "after/while", "exit"],
                detection_rows(results, all_cases))
    print("  detect s: slowdown -> `straggler` event; slowdown, gain, action: the event's; "
          "evict s: slowdown -> the round at world size 3; before: steps/s at 4 before the "
          "slowdown; while: at 4 after it; after: at 3 after the eviction")


def cost_summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [t["ratio"] for t in trials if t["ratio"] is not None]
    return {**{f"{mode}_steps_per_s": middle([t[mode] for t in trials], "steps_per_s")
               for mode in COST_MODES},
            "ratio": median(ratios) if ratios else None,
            "ratio_min": min(ratios, default=None), "ratio_max": max(ratios, default=None)}


def print_cost(summary: dict[str, Any], timing: Timing, trials: int) -> None:
    spread = "" if summary["ratio_min"] is None else \
        f"{summary['ratio_min']:.3f}-{summary['ratio_max']:.3f}"
    print_table(f"stragglers: the measurement's cost, elasticrun.torch script, --step-s "
                f"{COST_STEP_S:g}, no slowdown, {timing.cost_s:g} s a run, order alternating; "
                f"median of {trials}",
                ["off steps/s", "report steps/s", "report/off", "min-max"],
                [[_number(summary["off_steps_per_s"]), _number(summary["report_steps_per_s"]),
                  _number(summary["ratio"]), spread]])


def quiet_summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    return {"stragglers": sum(t["stragglers"] for t in trials),
            "cleared": sum(t["cleared"] for t in trials), "trials": len(trials),
            "exit": tally(trials, "exit"), "pause_taken": tally(trials, "pause_taken"),
            "steps_per_s": middle(trials, "steps_per_s")}


def print_quiet(summary: dict[str, Any], timing: Timing) -> None:
    print_table(f"stragglers: false alarms, --stragglers report, {timing.quiet_s:g} s: one "
                f"worker paused {timing.pause_s:g} s at {timing.pause_at_s:g} s, every "
                f"worker {timing.slow_all:g}x slower from {timing.slow_all_at_s:g} s for "
                f"{timing.slow_all_s:g} s",
                ["runs", "straggler events", "cleared events", "pause taken", "steps/s",
                 "exit"],
                [[summary["trials"], summary["stragglers"], summary["cleared"],
                  summary["pause_taken"], _number(summary["steps_per_s"]), summary["exit"]]])


# --- the benchmark ------------------------------------------------------------------------
def _part(found: list[dict[str, Any]],
          summarize: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> dict[str, Any]:
    return {"summary": summarize(found), "trials": found}


def bench(trials: int, quick: bool) -> dict[str, Any]:
    timing = QUICK if quick else FULL
    all_cases = cases(quick)
    detection = {}
    for case in all_cases:
        found = run_detection(case, timing, trials)
        detection[case.key] = {"script": case.script.name, "factor": case.factor,
                               "mode": case.mode, "summary": detection_summary(found),
                               "trials": found}
    print_detection(detection, all_cases, timing, trials)
    cost = _part(run_cost(timing, trials), cost_summary)
    print_cost(cost["summary"], timing, trials)
    quiet = _part(run_quiet(timing, trials), quiet_summary)
    print_quiet(quiet["summary"], timing)
    return {"hosts": HOSTS, "workers": SIZE, "step_s": STEP_S, "evict_flags": EVICT_FLAGS,
            "timing": asdict(timing), "trials_per_case": trials, "detection": detection,
            "cost": cost, "false_alarms": quiet}
