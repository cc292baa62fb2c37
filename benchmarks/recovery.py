"""Recovery: 4 workers (2 hosts x 2 slots on loopback), one SIGKILLed mid-training.

elasticrun: the survivors roll back to the last commit and go on in-process; the failed
host is blacklisted, so training resumes with the 2 workers of the other host.
torchrun (c10d rendezvous, --max-restarts 3, default --monitor-interval): every worker
is restarted and resumes from the last disk checkpoint, at the same world size of 4;
two agents of 2 workers each. As shipped, torch 2.13's torchrun restarts fail (see
benchlib.TORCHRUN_WORKAROUND), so it runs with the workaround, and once more as shipped.
A torchrun job that fails or hangs is reported as such.
Both commit (checkpoint) every COMMIT_EVERY steps; the kill comes halfway between two.

Measured per trial: seconds from the kill to the first completed step after recovery
("resume"), and to the first step beyond the one the kill interrupted ("caught up"); the
steps of work lost; and where the time went.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchlib import (
    SCRIPTS,
    TORCHRUN_WORKAROUND,
    Jobs,
    bench_env,
    elasticrun_command,
    free_port,
    print_table,
    read_events,
    summarize,
    torchrun_command,
)

COMMIT_EVERY = 10
STALL_S = 60.0  # a job without a new event for this long is hung
TOOLS = ("elasticrun", "torchrun", "torchrun (defaults)")
ER_PHASES = ("detection_s", "decision_s", "rendezvous_s", "gloo_s", "sync_s", "first_step_s")
TR_PHASES = ("restart_s", "import_s", "rendezvous_s", "checkpoint_s", "first_step_s")


def _first(events: list[dict[str, Any]], kind: str, after: float) -> dict[str, Any]:
    return next(e for e in events if e["event"] == kind and e["time"] > after)


def _outcome(events: list[dict[str, Any]], kill: dict[str, Any], synced: float) -> dict[str, Any]:
    resumed = _first(events, "step", synced)
    caught_up = next(e for e in events if e["event"] == "step" and e["time"] > synced
                     and e["step"] > kill["step"])
    restored = next(e["step"] for e in events
                    if e["event"] == "synced" and e["time"] > kill["time"])
    return {"resume_s": resumed["time"] - kill["time"],
            "caught_up_s": caught_up["time"] - kill["time"],
            "steps_lost": kill["step"] - restored}


def _training_env(out: Path, params: float, steps: int) -> dict[str, str]:
    kill_step = steps // 2 // COMMIT_EVERY * COMMIT_EVERY + COMMIT_EVERY // 2
    return bench_env({"BENCH_OUT": str(out), "BENCH_PARAMS": f"{params:g}",
                      "BENCH_STEPS": str(steps), "BENCH_KILL_STEP": str(kill_step),
                      "BENCH_KILL_RANK": "3", "BENCH_COMMIT_EVERY": str(COMMIT_EVERY),
                      "BENCH_CHECKPOINT_EVERY": str(COMMIT_EVERY)})


def elasticrun_trial(params: float, steps: int, tmp: Path, args: Sequence[str] = (),
                     env: dict[str, str] | None = None) -> dict[str, Any]:
    """One recovery; `args` and `env` add to the job's flags and environment (the GPU
    benchmark's backend and device)."""
    out, driver_log = tmp / "er.jsonl", tmp / "er-driver.jsonl"
    with Jobs() as jobs:
        jobs.start(elasticrun_command(["-H", "localhost:2,127.0.0.1:2", "--min-np", "2",
                                       "--event-log", str(driver_log), *args],
                                      SCRIPTS / "er_train.py"),
                   {**_training_env(out, params, steps), **(env or {})})
        jobs.wait(600, "elasticrun recovery job", progress=out, stall_s=STALL_S)
    driver = [{**e, "event": e["type"]} for e in read_events(driver_log)]
    events = read_events(out)
    kill = _first(events, "kill", 0)
    t = kill["time"]
    failed = _first(driver, "worker_failed", t)["time"]
    opened = _first(driver, "round_started", failed)["time"]
    resets = [e for e in events if e["event"] == "reset" and e["time"] > t]
    assigned = max(e["assigned"] for e in resets)
    built = max(e["built"] for e in resets)
    synced = max(e["time"] for e in events if e["event"] == "synced" and e["time"] > t)
    outcome = _outcome(events, kill, synced)
    resumed = t + outcome["resume_s"]
    breakdown = {"detection_s": failed - t, "decision_s": opened - failed,
                 "rendezvous_s": assigned - opened, "gloo_s": built - assigned,
                 "sync_s": synced - built, "first_step_s": resumed - synced}
    # A survivor's own side, overlapping the above: from its collective failing to its
    # join request (the round's groups aborted and torn down meanwhile).
    failures = {e["pid"]: e["time"] for e in events if e["event"] == "failure" and e["time"] > t}
    teardown = [e["asked"] - failures[e["pid"]] for e in resets if e["pid"] in failures]
    return {**outcome, **breakdown, "teardown_s": max(teardown, default=0.0),
            "params": _first(events, "done", 0)["params"],
            "timeline": _timeline(events, t, marks={"reset": opened, "resume": resumed})}


def torchrun_trial(params: float, steps: int, tmp: Path,
                   extra_env: dict[str, str]) -> dict[str, Any]:
    """Two agents of 2 workers each. A failed or hung job is a result too."""
    out = tmp / "tr.jsonl"
    env = {**_training_env(out, params, steps), "BENCH_CHECKPOINT_DIR": str(tmp), **extra_env}
    port = free_port()
    try:
        with Jobs() as jobs:
            for is_host in (True, False):
                jobs.start(torchrun_command(SCRIPTS / "torchrun_train.py", 2, nnodes="2",
                                            port=port, is_host=is_host,
                                            extra=["--max-restarts", "3"]), env)
            jobs.wait(600, "torchrun", progress=out, stall_s=STALL_S)
    except RuntimeError as exc:
        return {"error": str(exc)}
    events = read_events(out)
    kill = _first(events, "kill", 0)
    t = kill["time"]
    after = [e for e in events if e["time"] > t]
    restarted = min(e["at"] for e in after if e["event"] == "started")
    imported = max(e["time"] for e in after if e["event"] == "imported")
    initialized = max(e["time"] for e in after if e["event"] == "initialized")
    synced = max(e["time"] for e in after if e["event"] == "synced")
    outcome = _outcome(events, kill, synced)
    resumed = t + outcome["resume_s"]
    breakdown = {"restart_s": restarted - t, "import_s": imported - restarted,
                 "rendezvous_s": initialized - imported, "checkpoint_s": synced - initialized,
                 "first_step_s": resumed - synced}
    return {**outcome, **breakdown,
            "timeline": _timeline(events, t, marks={"reset": restarted, "resume": resumed})}


def _timeline(events: list[dict[str, Any]], kill: float,
              marks: dict[str, float]) -> dict[str, Any]:
    """Rank 0's completed steps, in seconds relative to the kill."""
    steps = [e["time"] - kill for e in events if e["event"] == "step" and e["rank"] == 0]
    return {"steps": steps, "marks": {k: v - kill for k, v in marks.items()}}


def bench(trials: int, quick: bool) -> dict[str, Any]:
    params, steps = (1e5, 2 * COMMIT_EVERY) if quick else (1e7, 4 * COMMIT_EVERY)
    # Quick mode leaves out torchrun as shipped: it hangs, so it costs a minute each time.
    tools = TOOLS[:2] if quick else TOOLS
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in tools}
    for _ in range(trials):  # interleaved, so that drift of the machine hits all
        for name in tools:
            with tempfile.TemporaryDirectory() as tmp:
                if name == "elasticrun":
                    runs[name].append(elasticrun_trial(params, steps, Path(tmp)))
                else:
                    extra = TORCHRUN_WORKAROUND if name == "torchrun" else {}
                    runs[name].append(torchrun_trial(params, steps, Path(tmp), extra))
    if any("error" in run for run in runs["elasticrun"]):
        raise RuntimeError(f"elasticrun failed to recover: {runs['elasticrun']}")
    medians = {name: summarize(ok) for name, trial in runs.items()
               if (ok := [run for run in trial if "error" not in run])}
    ours = medians["elasticrun"]
    rows: list[list[Any]] = []
    for name in tools:
        failed = [run["error"] for run in runs[name] if "error" in run]
        note = f"{len(failed)} of {trials} failed: {failed[0][:90]}" if failed else ""
        if name not in medians:
            rows.append([name, "-", "-", "-", "-", note])
            continue
        m = medians[name]
        slower = "" if name == "elasticrun" else f"{m['resume_s'] / ours['resume_s']:.1f}x"
        rows.append([name, m["resume_s"], slower, m["caught_up_s"], m["steps_lost"], note])
    print_table(
        f"recovery: 4 workers, ~{ours['params'] / 1e6:.1f}M parameters, one SIGKILLed; "
        f"commit/checkpoint every {COMMIT_EVERY} steps; median of {trials}",
        ["", "resume s", "vs elasticrun", "caught up s", "steps lost", ""], rows)
    print_table("  elasticrun's resume, broken down (s)", ER_PHASES,
                [[ours[k] for k in ER_PHASES]])
    for name in tools[1:]:
        if name in medians:
            print_table(f"  {name}'s resume, broken down (s)", TR_PHASES,
                        [[medians[name][k] for k in TR_PHASES]])
    plot = _plot(runs, quick)
    return {"median": medians, "trials": runs, "plot": str(plot) if plot else None}


def _plot(runs: dict[str, list[dict[str, Any]]], quick: bool) -> Path | None:
    """The first trial of each tool that recovered, on one plot."""
    from timeline import plot_recovery

    timelines = {name: ok[0]["timeline"] for name, trials in runs.items()
                 if (ok := [run for run in trials if "error" not in run])}
    return plot_recovery(timelines, f"recovery-timeline{'-quick' if quick else ''}.png")
