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

import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stragglers_jobs import (
    COST_MODES,
    COST_STEP_S,
    EVICT_FLAGS,
    FULL,
    HOSTS,
    QUICK,
    SIZE,
    STEP_S,
    TRAIN_SCRIPT,
    Case,
    PacedJob,
    Timing,
    cases,
    gone,
    sleep_until,
)
from stragglers_report import (
    cost_summary,
    detection_summary,
    print_cost,
    print_detection,
    print_quiet,
    quiet_summary,
)

WARM_S = 2.0  # the cost runs' first seconds, left out of their rate
ROUND_TIMEOUT_S = 60.0  # eviction -> the round at the smaller size
DETECTED_AFTER_S = 2.0  # a detection-only run goes on this long after its event


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
