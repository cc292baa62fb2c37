"""Recovery as a distribution: its median and its tail, for a crashed and a hung worker.

One elasticrun job per (model size, fault kind) suffers every fault of its trials: 4
workers on 2 loopback hosts (`-H localhost:2,127.0.0.1:2 --min-np 2
--blacklist-cooldown-range 1 1`) train scripts/er_soak.py (model.py's MLP at ~1.1M or
~10.2M parameters, a commit every step) until the benchmark creates its stop file. Each
trial waits until the job is at 4 workers and rank 0 has done WARM_STEPS steps in that
round, then a random fraction of a step (so that faults land anywhere in a step), then
  kill  SIGKILLs the highest rank on the host that does not hold rank 0 (a crash);
  hang  SIGSTOPs it (elasticrun's hang detection finds it stopped and kills it).
The 3 survivors roll back to their last commit and go on; the dead worker's slot gets a new
worker, and the job grows back to 4 at a commit, where the next trial starts.

Per trial, from the fault's time (taken just before the signal) and the events' wall-clock
times (the driver's --event-log, the workers' events):
  recovery     the fault -> the first step a survivor completes in the round after it;
  detection    the fault -> the driver's first `worker_failed` after it;
  decision     -> its `round_started` of that round;
  rendezvous   -> the survivors' group of that round built (their last "reset");
  sync         -> their state synced (the last "synced");
  first step   -> that first step;
  steady step  rank 0's median step interval at 4 workers just before the fault (its
               round's first step left out); at ~10.2M the recovery overhead is the
               recovery minus this one step (below zero where the first step after, at 2
               workers sharing the machine's cores, is quicker than one at 4).
Reported per size: p50 / p90 / p99 / max of the recovery (interpolated between the sorted
trials), the phases' medians per kind. A trial that does not recover within RECOVER_S, or
a job not back at 4 workers within READY_S, fails: it is reported, and a fresh job goes on
with the remaining faults (at most MAX_JOBS jobs per size and kind).
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib import (
    SCRIPTS,
    Jobs,
    Tail,
    bench_env,
    elasticrun_command,
    median,
    print_table,
    tagged_pids,
)

SIZES = (1e6, 1e7)  # BENCH_PARAMS: ~1.1M and ~10.2M parameters
OVERHEAD_SIZE = 1e7
KINDS = {"kill": signal.SIGKILL, "hang": signal.SIGSTOP}
MIN_TRIALS = 30
QUICK_TRIALS = 1
SLOTS = 2  # per host
FULL = 2 * SLOTS
WARM_STEPS = 6  # rank 0's steps at full size before a fault
READY_S = 60.0
RECOVER_S = 60.0
DRIVER_LAG_S = 5.0  # the driver's event log is written behind its events
STOP_S = 60.0
MAX_JOBS = 3
POLL_S = 0.02
PHASES = ("detection_s", "decision_s", "rendezvous_s", "sync_s", "first_step_s")

Event = dict[str, Any]


@dataclass
class Soak:
    """One job of 2 hosts x SLOTS workers that trains until its stop file appears; its
    events as they come, rank 0's steps and each rank's latest event by round."""

    jobs: Jobs
    tmp: Path
    params: float
    events: list[Event] = field(default_factory=list)
    driver: list[Event] = field(default_factory=list)
    leader: dict[int, list[Event]] = field(default_factory=dict)
    members: dict[int, dict[int, Event]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.stop_file = self.tmp / "stop"
        self._events = Tail(self.tmp / "events.jsonl")
        self._driver = Tail(self.tmp / "driver.jsonl")
        self.proc = self.jobs.start(
            elasticrun_command(["-H", f"localhost:{SLOTS},127.0.0.1:{SLOTS}", "--min-np",
                                str(SLOTS), "--blacklist-cooldown-range", "1", "1",
                                "--event-log", str(self._driver.path)],
                               SCRIPTS / "er_soak.py"),
            bench_env({"BENCH_OUT": str(self._events.path), "BENCH_PARAMS": f"{self.params:g}",
                       "BENCH_STOP_FILE": str(self.stop_file)}))

    def poll(self) -> list[Event]:
        """The workers' new events (the driver's are gathered too)."""
        self.driver += [{**e["data"], "event": e["type"], "time": e["time"]}
                        for e in self._driver.read()]
        new = self._events.read()
        for e in new:
            if e["event"] == "step":
                self.members.setdefault(e["round"], {})[e["rank"]] = e
                if e["rank"] == 0:
                    self.leader.setdefault(e["round"], []).append(e)
        self.events += new
        return new

    def wait(self, found: Callable[[list[Event]], Any], timeout: float) -> Any:
        """found(new events)'s first answer that is not None, polled; None after `timeout`
        seconds or once the job has ended."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if (answer := found(self.poll())) is not None:
                return answer
            time.sleep(POLL_S)
        return None

    def ready(self, after: int) -> int | None:
        """The round after round `after` where the job is at full size and rank 0 has done
        WARM_STEPS steps, if rank 0 is in it now."""
        if not self.leader:
            return None
        now = max(self.leader)
        steps = self.leader[now]
        return now if now > after and steps[0]["size"] == FULL and \
            len(steps) >= WARM_STEPS else None

    def stop(self) -> str | None:
        """Stops the job through its stop file; what went wrong, if anything."""
        self.stop_file.touch()
        try:
            self.jobs.wait(STOP_S, "the soak job")
        except RuntimeError as exc:
            return str(exc)
        return None


def _state(pid: int) -> str:
    """The process's kernel state (R, S, T for stopped, Z...), or "gone"."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat.rpartition(")")[2].split()[0]


def fault(soak: Soak, sig: signal.Signals, after: int, rng: random.Random) -> Event:
    """One fault, once the job is ready, and its recovery; {"error": ...} if it fails."""
    ready = soak.wait(lambda _: soak.ready(after), READY_S)
    if ready is None:
        return {"error": f"not at {FULL} workers with {WARM_STEPS} steps within {READY_S:g} s"
                         + ("" if soak.proc.poll() is None else " (the job ended)")}
    members = soak.members[ready]
    holder = members[0]["host"]
    victim = members[max(rank for rank, e in members.items() if e["host"] != holder)]
    steps = [e["time"] for e in soak.leader[ready]]
    steady = median(b - a for a, b in itertools.pairwise(steps[1:]))
    time.sleep(rng.uniform(0, steady))
    t = time.time()
    os.kill(victim["pid"], sig)
    first = soak.wait(lambda new: next(
        (e for e in new if e["event"] == "step" and e["round"] > ready and e["time"] > t
         and e["pid"] != victim["pid"]), None), RECOVER_S)
    if first is None:
        return {"error": f"no step within {RECOVER_S:g} s of the fault"
                         + ("" if soak.proc.poll() is None else " (the job ended)"),
                "victim_state": _state(victim["pid"])}
    opened = soak.wait(lambda _: next((e for e in soak.driver if e["event"] == "round_started"
                                       and e["round"] == first["round"]), None), DRIVER_LAG_S)
    failed = next((e for e in soak.driver if e["event"] == "worker_failed" and e["time"] > t),
                  None)
    if opened is None or failed is None:
        return {"error": "the driver logged no worker_failed or round_started"}
    soak.poll()
    new_round = [e for e in soak.events if e.get("round") == first["round"]]
    built = max(e["built"] for e in new_round if e["event"] == "reset")
    synced = max(e["time"] for e in new_round if e["event"] == "synced")
    return {"recovery_s": first["time"] - t, "detection_s": failed["time"] - t,
            "decision_s": opened["time"] - failed["time"], "rendezvous_s": built - opened["time"],
            "sync_s": synced - built, "first_step_s": first["time"] - synced,
            "steady_step_s": steady, "size_after": first["size"], "round": first["round"],
            "victim_rank": victim["rank"], "failure": failed["kind"],
            "victim_state": _state(victim["pid"])}


def soak(params: float, kind: str, faults: int, rng: random.Random) -> dict[str, Any]:
    """`faults` faults of one kind, in one job (a fresh one after a failed trial)."""
    trials: list[Event] = []
    notes: list[str] = []
    parameters = 0
    for _ in range(MAX_JOBS):
        with tempfile.TemporaryDirectory() as tmp, Jobs() as jobs:
            job = Soak(jobs, Path(tmp), params)
            last = 0
            while sum("error" not in trial for trial in trials) < faults:
                trials.append(fault(job, KINDS[kind], last, rng))
                if "error" in trials[-1]:
                    break
                last = trials[-1]["round"]
            parameters = next((e["params"] for e in job.events if e["event"] == "joined"),
                              parameters)
            if "error" not in trials[-1] and (problem := job.stop()):
                notes.append(problem)
            # A hung worker is the driver's to kill: one still stopped is a leak.
            stopped = [pid for pid in tagged_pids(jobs.tag) if _state(pid) == "T"]
            if stopped:
                notes.append(f"{len(stopped)} process(es) left stopped: {stopped}")
        if "error" not in trials[-1]:
            break
    return {"params": parameters, "trials": trials, "notes": notes}


def percentile(values: Sequence[float], p: float) -> float:
    """Linear interpolation between the closest ranks of the sorted values."""
    ordered = sorted(values)
    at = (len(ordered) - 1) * p / 100
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def distribution(values: Sequence[float]) -> dict[str, float]:
    return {"p50": percentile(values, 50), "p90": percentile(values, 90),
            "p99": percentile(values, 99), "max": max(values)}


def report(params: float, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Prints one size's tables; returns its summary."""
    label = f"~{max(run['params'] for run in runs.values()) / 1e6:.1f}M parameters"
    summary: dict[str, Any] = {}
    rows: list[list[Any]] = []
    phase_rows: list[list[Any]] = []
    overhead_rows: list[list[Any]] = []
    for kind, run in runs.items():
        ok = [trial for trial in run["trials"] if "error" not in trial]
        errors = [trial["error"] for trial in run["trials"] if "error" in trial]
        if not ok:
            rows.append([kind, "-", "-", "-", "-", 0, len(errors)])
            continue
        spread = distribution([trial["recovery_s"] for trial in ok])
        phases = {phase: median(trial[phase] for trial in ok)
                  for phase in (*PHASES, "steady_step_s")}
        overhead = distribution([trial["recovery_s"] - trial["steady_step_s"] for trial in ok])
        summary[kind] = {"recovery": spread, "phases": phases, "overhead": overhead,
                         "failed": errors, "notes": run["notes"]}
        rows.append([kind, *spread.values(), len(ok), len(errors)])
        phase_rows.append([kind, *phases.values()])
        overhead_rows.append([kind, *overhead.values(), phases["steady_step_s"]])
    print_table(f"recovery, {label}: {FULL} workers on 2 hosts, one worker faulted per trial; "
                "fault -> first step after it (s)",
                ["", "p50", "p90", "p99", "max", "trials", "failed"], rows)
    print_table("  its phases, medians (s)",
                ["", *(phase.removesuffix("_s").replace("_", " ") for phase in PHASES),
                 "steady step"], phase_rows)
    if params == OVERHEAD_SIZE:
        print_table(f"  recovery overhead: fault -> first step after, minus one steady step at "
                    f"{FULL} workers (s)", ["", "p50", "p90", "p99", "max", "steady step"],
                    overhead_rows)
    for kind, run in runs.items():
        for problem in [trial["error"] for trial in run["trials"] if "error" in trial] \
                + run["notes"]:
            print(f"  {kind}: {problem}")
    return summary


def bench(trials: int, quick: bool) -> dict[str, Any]:
    faults = QUICK_TRIALS if quick else max(trials, MIN_TRIALS)
    rng = random.Random(0)
    result: dict[str, Any] = {}
    for params in SIZES[:1] if quick else SIZES:
        kinds = ["hang"] if quick else list(KINDS)  # quick: the recovery smoke has a kill
        runs = {kind: soak(params, kind, faults, rng) for kind in kinds}
        result[f"{params:g}"] = {"summary": report(params, runs), **runs}
    return result
