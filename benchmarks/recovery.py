"""Recovery: 4 workers (2 hosts x 2 slots on loopback), one SIGKILLed mid-training.

elasticrun: the 3 survivors roll back to the last commit and go on in-process (--min-np 2);
the dead worker's slot gets a new worker, which joins at a later commit.
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

import itertools
import json
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchlib import (
    PYTHON,
    SCRIPTS,
    TORCHRUN_WORKAROUND,
    Jobs,
    bench_env,
    elasticrun_command,
    free_port,
    median,
    print_table,
    read_events,
    summarize,
    torchrun_command,
)

COMMIT_EVERY = 10
SLOTS = 2  # workers per host (2 hosts); quick mode runs 1
STALL_S = 60.0  # a job without a new event for this long is hung
TOOLS = ("elasticrun", "torchrun", "torchrun (defaults)")
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


def _training_env(out: Path, params: float, steps: int, slots: int) -> dict[str, str]:
    kill_step = steps // 2 // COMMIT_EVERY * COMMIT_EVERY + COMMIT_EVERY // 2
    return bench_env({"BENCH_OUT": str(out), "BENCH_PARAMS": f"{params:g}",
                      "BENCH_STEPS": str(steps), "BENCH_KILL_STEP": str(kill_step),
                      "BENCH_KILL_RANK": str(2 * slots - 1),  # on the second host
                      "BENCH_COMMIT_EVERY": str(COMMIT_EVERY),
                      "BENCH_CHECKPOINT_EVERY": str(COMMIT_EVERY)})


def elasticrun_trial(params: float, steps: int, tmp: Path, args: Sequence[str] = (),
                     env: dict[str, str] | None = None, slots: int = SLOTS) -> dict[str, Any]:
    """One recovery on 2 hosts of `slots` workers; `args` and `env` add to the job's flags
    and environment (the GPU benchmark's backend and device)."""
    out, driver_log = tmp / "er.jsonl", tmp / "er-driver.jsonl"
    with Jobs() as jobs:
        jobs.start(elasticrun_command(["-H", f"localhost:{slots},127.0.0.1:{slots}",
                                       "--min-np", str(slots), "--event-log", str(driver_log),
                                       *args], SCRIPTS / "er_train.py"),
                   {**_training_env(out, params, steps, slots), **(env or {})})
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
            **_steady(events, synced), "anon_mb": kill.get("anon_mb", 0),
            "params": _first(events, "done", 0)["params"],
            "timeline": _timeline(events, t, marks={"reset": opened, "resume": resumed})}


def _steady(events: list[dict[str, Any]], synced: float) -> dict[str, float]:
    """After the recovery, at the new size: rank 0's median step interval (the first step
    after the reset left out) and the median duration of one commit."""
    after = [e for e in events if e["event"] == "step" and e["rank"] == 0 and e["time"] > synced]
    intervals = [b["time"] - a["time"] for a, b in itertools.pairwise(after[1:])]
    commits = [e["commit_s"] for e in events if e["event"] == "step" and e["commit_s"] > 0]
    return {"steady_step_s": median(intervals) if intervals else 0.0,
            "commit_s": median(commits) if commits else 0.0}


def floors(anon_mb: float, trials: int) -> dict[str, float]:
    """Raw torch.distributed floors (scripts/recovery_floors.py) for a killed process
    holding `anon_mb` MiB."""
    result = subprocess.run([PYTHON, str(SCRIPTS / "recovery_floors.py"), str(int(anon_mb)),
                             str(trials)], capture_output=True, text=True, timeout=300,
                            check=True, env=bench_env())
    floor: dict[str, float] = json.loads(result.stdout.splitlines()[-1])
    return floor


# Each phase of elasticrun's resume against its floor: a raw Gloo peer-death probe; none
# (the driver's own work); the step in flight when the kill came (survivors learn of the
# failure when their step's reduction fails); a raw 2-rank Gloo build through a TCPStore;
# one steady-state commit (a sync where every rank holds the commit is a check and one
# commit); one steady-state step.
FLOORS = {"detection_s": "death_s", "decision_s": None, "rendezvous_s": "steady_step_s",
          "gloo_s": "build_s", "sync_s": "commit_s", "first_step_s": "steady_step_s"}


def floor_rows(ours: dict[str, float], floor: dict[str, float]) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for phase, name in FLOORS.items():
        base = None if name is None else floor.get(name, ours.get(name))
        rows.append([phase.removesuffix("_s"), ours[phase], "-" if base is None else base,
                     "-" if not base else f"{ours[phase] / base:.1f}x"])
    return rows


def torchrun_trial(params: float, steps: int, tmp: Path, extra_env: dict[str, str],
                   slots: int = SLOTS, agents: int = 2) -> dict[str, Any]:
    """`agents` agents of `slots` workers each; the last rank is killed. A failed or hung
    job is a result too."""
    out = tmp / "tr.jsonl"
    env = {**_training_env(out, params, steps, slots), "BENCH_CHECKPOINT_DIR": str(tmp),
           "BENCH_KILL_RANK": str(agents * slots - 1), **extra_env}
    port = free_port()
    try:
        with Jobs() as jobs:
            for is_host in [True, *[False] * (agents - 1)]:
                jobs.start(torchrun_command(SCRIPTS / "torchrun_train.py", slots,
                                            nnodes=str(agents), port=port, is_host=is_host,
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


def small_model(trials: int, quick: bool, params: float) -> dict[str, Any]:
    """elasticrun alone on a smaller model, whose step is not most of the resume."""
    steps = 2 * COMMIT_EVERY if quick else 4 * COMMIT_EVERY
    runs = []
    for _ in range(trials):
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(elasticrun_trial(params, steps, Path(tmp)))
    ours = summarize(runs)
    floor = floors(ours["anon_mb"], 1 if quick else 3)
    print_table(f"recovery, elasticrun alone, ~{ours['params'] / 1e6:.1f}M parameters: resume "
                f"{ours['resume_s']:.3f} s (median of {trials}); phases against their floors",
                ["phase", "s", "floor s", "ratio"], floor_rows(ours, {**ours, **floor}))
    for run in runs:
        run.pop("timeline")
    return {"median": ours, "floors": floor, "trials": runs}


def bench(trials: int, quick: bool) -> dict[str, Any]:
    params, steps = (1e5, 2 * COMMIT_EVERY) if quick else (1e7, 4 * COMMIT_EVERY)
    # Quick mode leaves out torchrun as shipped (it hangs, so it costs a minute each time)
    # and runs one worker per host: the same paths at half the processes; torchrun's side,
    # most of the smoke test's CPU (every restarted worker imports torch), one agent.
    tools = TOOLS[:2] if quick else TOOLS
    slots = 1 if quick else SLOTS
    agents = 1 if quick else 2
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in tools}
    for _ in range(trials):  # interleaved, so that drift of the machine hits all
        for name in tools:
            with tempfile.TemporaryDirectory() as tmp:
                if name == "elasticrun":
                    runs[name].append(elasticrun_trial(params, steps, Path(tmp), slots=slots))
                else:
                    extra = TORCHRUN_WORKAROUND if name == "torchrun" else {}
                    runs[name].append(torchrun_trial(params, steps, Path(tmp), extra, slots,
                                                     agents))
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
        f"recovery: {2 * slots} workers ({agents * slots} under torchrun), "
        f"~{ours['params'] / 1e6:.1f}M parameters, one SIGKILLed; "
        f"commit/checkpoint every {COMMIT_EVERY} steps; median of {trials}",
        ["", "resume s", "vs elasticrun", "caught up s", "steps lost", ""], rows)
    floor = floors(ours["anon_mb"], 1 if quick else 3)
    print_table("  elasticrun's resume, broken down, against each phase's floor measured now "
                f"(killed process: {ours['anon_mb']:.0f} MiB anonymous memory)",
                ["phase", "s", "floor s", "ratio"], floor_rows(ours, {**ours, **floor}))
    for name in tools[1:]:
        if name in medians:
            print_table(f"  {name}'s resume, broken down (s)", TR_PHASES,
                        [[medians[name][k] for k in TR_PHASES]])
    plot = _plot(runs, quick)
    # quick: the same code path as above at another size; not worth the suite's time
    small = None if quick else small_model(trials, quick, 1e6)
    return {"median": medians, "floors": floor, "trials": runs, "small_model": small,
            "plot": str(plot) if plot else None}


def _plot(runs: dict[str, list[dict[str, Any]]], quick: bool) -> Path | None:
    """The first trial of each tool that recovered, on one plot."""
    from timeline import plot_recovery

    timelines = {name: ok[0]["timeline"] for name, trials in runs.items()
                 if (ok := [run for run in trials if "error" not in run])}
    return plot_recovery(timelines, f"recovery-timeline{'-quick' if quick else ''}.png")
