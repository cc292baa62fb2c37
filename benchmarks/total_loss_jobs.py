"""The total-loss benchmark's jobs (benchmarks/total_loss.py): how each is launched and what
one run measured. A throughput job: rank 0's steps/s and its commits' duration. A total
loss (every rank SIGKILLing itself at KILL_STEP) under elasticrun, its commits kept in a
host snapshot or a checkpoint directory, or under torchrun restarting from a DCP
checkpoint: kill -> the restarted job's first step, and its phases.
"""

from __future__ import annotations

import tempfile
from itertools import pairwise
from pathlib import Path
from typing import Any

from benchlib import (
    SCRIPTS,
    TORCHRUN_WORKAROUND,
    Jobs,
    bench_env,
    elasticrun_command,
    free_port,
    median,
    read_events,
    torchrun_command,
)

ER_SCRIPT = SCRIPTS / "er_total_loss_train.py"
TR_SCRIPT = SCRIPTS / "torchrun_dcp_train.py"
WARMUP_STEPS = 5
WINDOW = 10
COMMIT_EVERY = 10  # the loss runs: commit (checkpoint) every 10 steps
KILL_STEP = 25
LOSS_STEPS = 35  # the restarted job trains from the commit of step 20 to here
JOB_TIMEOUT_S = 600.0
STALL_S = 120.0  # a job whose event file stops growing this long is hung
# measured steps of a throughput job, by size: about 10-20 s of training here
THROUGHPUT_STEPS = {1e5: 60, 1e6: 300, 1e7: 80, 1e8: 30}
THROUGHPUT_CONFIGS = ("on_10", "off_10", "on_1", "off_1")
LOSS_VARIANTS = ("host snapshot", "checkpoint dir", "torchrun + DCP")
ER_PHASES = ("detection_s", "decision_s", "round_s", "spawn_s", "setup_s", "first_step_s")
TR_PHASES = ("restart_s", "imports_init_s", "load_s", "first_step_s")


# --- 1. throughput ------------------------------------------------------------------------
def throughput_job(config: str, params: float) -> dict[str, float]:
    """One 2-worker job: rank 0's steps/s (median over windows) and commit ms (median)."""
    snapshots, every = config.split("_")
    steps = THROUGHPUT_STEPS[params]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "events.jsonl"
        env = bench_env({"BENCH_OUT": str(out), "BENCH_PARAMS": f"{params:g}",
                         "BENCH_STEPS": str(steps + WARMUP_STEPS), "BENCH_COMMIT_EVERY": every})
        flags = [] if snapshots == "on" else ["--no-host-snapshots"]
        with Jobs() as jobs:
            jobs.start(elasticrun_command(["-np", "2", *flags], ER_SCRIPT), env)
            jobs.wait(JOB_TIMEOUT_S, f"throughput job ({config}, {params:g})", progress=out,
                      stall_s=STALL_S)
        steps_0 = [e for e in read_events(out) if e["event"] == "step" and e["rank"] == 0]
    times = [e["time"] for e in steps_0[WARMUP_STEPS:]]
    rate = median(WINDOW / (times[i + WINDOW] - times[i])
                  for i in range(0, len(times) - WINDOW, WINDOW))
    commits = [e["commit_s"] for e in steps_0[WARMUP_STEPS:] if e["commit_s"] > 0]
    return {"steps_per_s": rate, "commit_ms": 1e3 * median(commits) if commits else 0.0}


# --- 2. a total loss under elasticrun -----------------------------------------------------
def loss_env(out: Path, tmp: Path, params: float) -> dict[str, str]:
    return bench_env({"BENCH_OUT": str(out), "BENCH_PARAMS": f"{params:g}",
                      "BENCH_STEPS": str(LOSS_STEPS), "BENCH_COMMIT_EVERY": str(COMMIT_EVERY),
                      "BENCH_CHECKPOINT_EVERY": str(COMMIT_EVERY),
                      "BENCH_CHECKPOINT_DIR": str(tmp / "dcp"),
                      "BENCH_KILL_STEP": str(KILL_STEP), "BENCH_MARKER_DIR": str(tmp)})


def _first(events: list[dict[str, Any]], key: str, kind: str, after: float) -> dict[str, Any]:
    found = next((e for e in events if e[key] == kind and e["time"] > after), None)
    if found is None:
        raise RuntimeError(f"no {kind!r} event after the kill")
    return found


def _kill_and_resume(events: list[dict[str, Any]]) -> tuple[float, int, dict[str, Any]]:
    """The kill's time (the first rank's), its step, and rank 0's first step of a new
    worker after it."""
    kills = [e for e in events if e["event"] == "kill"]
    if len(kills) != 2:
        raise RuntimeError(f"expected every rank of 2 to kill itself, saw {len(kills)}")
    old = {e["pid"] for e in kills}
    killed = min(e["time"] for e in kills)
    resumed = next((e for e in events if e["event"] == "step" and e["rank"] == 0
                    and e["pid"] not in old and e["time"] > killed), None)
    if resumed is None:
        raise RuntimeError("no step of a new worker after the kill")
    return killed, kills[0]["step"], resumed


def first_entries(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each new worker's first "synced" event (a later one is a reset of the new round)."""
    first: dict[int, dict[str, Any]] = {}
    for event in events:
        if event["event"] == "synced":
            first.setdefault(event["pid"], event)
    return list(first.values())


def elasticrun_loss(params: float, variant: str, tmp: Path) -> dict[str, Any]:
    out, driver_log = tmp / "events.jsonl", tmp / "driver.jsonl"
    flags = ["--event-log", str(driver_log)]
    if variant == "checkpoint dir":
        flags += ["--no-host-snapshots", "--checkpoint-dir", str(tmp / "kept"),
                  "--checkpoint-interval", "0"]
    with Jobs() as jobs:
        jobs.start(elasticrun_command(["-np", "2", *flags], ER_SCRIPT),
                   loss_env(out, tmp, params))
        jobs.wait(JOB_TIMEOUT_S, f"elasticrun total loss ({variant}, {params:g})",
                  progress=out, stall_s=STALL_S)
    events, driver = read_events(out), read_events(driver_log)
    killed, kill_step, resumed = _kill_and_resume(events)
    failed = _first(driver, "type", "worker_failed", killed)["time"]
    lost = _first(driver, "type", "total_loss", killed)["time"]
    opened = _first(driver, "type", "round_started", lost)["time"]
    restored = _first(driver, "type", "state_restored", lost)
    after = [e for e in events if e["time"] > killed]
    spawned = min(e["at"] for e in after if e["event"] == "started")
    synced = first_entries(after)
    chain = [killed, failed, lost, opened, spawned, max(e["time"] for e in synced),
             resumed["time"]]
    phases = {name: b - a for name, (a, b) in zip(ER_PHASES, pairwise(chain), strict=True)}
    return {"resume_s": resumed["time"] - killed, **phases,
            "steps_lost": kill_step - synced[0]["step"],
            "reentries": sum(e["event"] == "synced" for e in after) - len(synced),
            "restored_commit": restored["data"]["commit"],
            "source": restored["data"]["source"]}


# --- 3. the peer: torchrun restarting from a DCP checkpoint -------------------------------
def torchrun_loss(params: float, tmp: Path) -> dict[str, Any]:
    out = tmp / "events.jsonl"
    env = {**loss_env(out, tmp, params), **TORCHRUN_WORKAROUND}
    command = torchrun_command(TR_SCRIPT, 2, port=free_port(), extra=["--max-restarts", "1"])
    with Jobs() as jobs:
        jobs.start(command, env)
        jobs.wait(JOB_TIMEOUT_S, f"torchrun total loss ({params:g})", progress=out,
                  stall_s=STALL_S)
    events = read_events(out)
    killed, kill_step, resumed = _kill_and_resume(events)
    after = [e for e in events if e["time"] > killed]
    spawned = min(e["at"] for e in after if e["event"] == "started")
    initialized = max(e["time"] for e in after if e["event"] == "initialized")
    synced = [e for e in after if e["event"] == "synced"]
    chain = [killed, spawned, initialized, max(e["time"] for e in synced), resumed["time"]]
    phases = {name: b - a for name, (a, b) in zip(TR_PHASES, pairwise(chain), strict=True)}
    return {"resume_s": resumed["time"] - killed, **phases,
            "steps_lost": kill_step - synced[0]["step"], "source": "DCP"}


def loss_trial(params: float, variant: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        try:
            if variant == "torchrun + DCP":
                return torchrun_loss(params, tmp)
            return elasticrun_loss(params, variant, tmp)
        except RuntimeError as exc:  # a failed or hung job is a result too
            return {"error": str(exc)}
