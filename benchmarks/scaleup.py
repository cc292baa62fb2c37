"""Scale-up: a second host (2 slots) appears while 2 workers train.

elasticrun: the host appears in the discovery script's output; the driver starts 2 workers
there, the running workers finish their step, commit, and all 4 meet in a new round —
no running worker restarts. Measured from the moment the discovery output changes to the
first completed step at world size 4, broken down into: notice (discovery), spawn
(driver starts the process, interpreter up), import (torch and elasticrun), rendezvous
(the running workers reach a commit, the new round forms), Gloo group, state sync, first
step. Target: at most one discovery interval + the new processes' own start-up + 0.5 s.

torchrun (--nnodes 1:2, c10d): a second agent is started on the new "host"; the first
agent stops its workers and every worker restarts from the last disk checkpoint. Measured
from the second agent's start to the first step at world size 4.
"""

from __future__ import annotations

import os
import tempfile
import time
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

DISCOVERY_INTERVAL_S = 1.0
CHECKPOINT_EVERY = 10
ER_PHASES = ("notice_s", "spawn_s", "import_s", "rendezvous_s", "gloo_s", "sync_s",
             "first_step_s")
TR_PHASES = ("restart_s", "import_s", "rendezvous_s", "checkpoint_s", "first_step_s")


def _wait_for_steps(out: Path, count: int, jobs: Jobs, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while sum(e["event"] == "step" for e in read_events(out)) < count:
        if time.monotonic() > deadline or any(p.poll() is not None for p in jobs.procs):
            raise RuntimeError("the scale-up job stopped or never started training")
        time.sleep(0.1)


def _env(out: Path, params: float, slots: int) -> dict[str, str]:
    return bench_env({"BENCH_OUT": str(out), "BENCH_PARAMS": f"{params:g}",
                      "BENCH_STEPS": "100000", "BENCH_TARGET_SIZE": str(2 * slots),
                      "BENCH_STEPS_AT_TARGET": "3", "BENCH_COMMIT_EVERY": "1",
                      "BENCH_CHECKPOINT_EVERY": str(CHECKPOINT_EVERY)})


def elasticrun_trial(params: float, tmp: Path, slots: int) -> dict[str, Any]:
    out, driver_log, hosts = tmp / "er.jsonl", tmp / "driver.jsonl", tmp / "hosts"
    hosts.write_text(f"localhost:{slots}\n")
    script = tmp / "hosts.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    with Jobs() as jobs:
        jobs.start(elasticrun_command(
            ["-np", str(slots), "--min-np", str(slots), "--max-np", str(2 * slots),
             "--host-discovery-script",
             str(script), "--discovery-interval", str(DISCOVERY_INTERVAL_S),
             "--event-log", str(driver_log)], SCRIPTS / "er_train.py"), _env(out, params, slots))
        _wait_for_steps(out, 10, jobs)
        staged = tmp / "hosts.new"
        staged.write_text(f"localhost:{slots}\n127.0.0.1:{slots}\n")
        changed = time.time()
        os.replace(staged, hosts)
        jobs.wait(300, "elasticrun scale-up job", progress=out)
    events = [e for e in read_events(out) if e["time"] > changed]
    driver = [{**e, "event": e["type"]} for e in read_events(driver_log)]
    noticed = next(e["time"] for e in driver if e["event"] == "host_added"
                   and e["time"] > changed)
    new_pids = {e["pid"] for e in events if e["event"] == "started"}
    new = [e for e in events if e["pid"] in new_pids]
    grown = [e for e in events if e.get("size") == 2 * slots]
    started = max(e["at"] for e in new if e["event"] == "started")
    imported = max(e["time"] for e in new if e["event"] == "imported")
    joins = [e for e in grown if e["event"] in ("joined", "reset")]
    assigned, built = max(e["assigned"] for e in joins), max(e["built"] for e in joins)
    synced = max(e["time"] for e in grown if e["event"] == "synced")
    stepped = min(e["time"] for e in grown if e["event"] == "step")
    own_startup = max(e["asked"] for e in new if e["event"] == "joined") - min(
        e["at"] for e in new if e["event"] == "started")
    return {"total_s": stepped - changed, "notice_s": noticed - changed,
            "spawn_s": started - noticed, "import_s": imported - started,
            "rendezvous_s": assigned - imported, "gloo_s": built - assigned,
            "sync_s": synced - built, "first_step_s": stepped - synced,
            "own_startup_s": own_startup,
            "budget_s": DISCOVERY_INTERVAL_S + own_startup + 0.5, "steps_lost": 0}


def torchrun_trial(params: float, tmp: Path, slots: int) -> dict[str, Any]:
    out = tmp / "tr.jsonl"
    env = {**_env(out, params, slots), "BENCH_CHECKPOINT_DIR": str(tmp), **TORCHRUN_WORKAROUND}
    port = free_port()
    try:
        with Jobs() as jobs:
            for is_host in (True, False):  # the second agent is the new host
                if not is_host:
                    _wait_for_steps(out, 10, jobs)
                    added = time.time()
                jobs.start(torchrun_command(
                    SCRIPTS / "torchrun_train.py", slots, nnodes="1:2", port=port,
                    is_host=is_host, rdzv_conf="last_call_timeout=1",
                    extra=["--max-restarts", "3"]), env)
            jobs.wait(300, "torchrun", progress=out)
    except RuntimeError as exc:
        return {"error": str(exc)}
    events = read_events(out)
    before = max(e["step"] for e in events if e["event"] == "step" and e["size"] == slots)
    grown = [e for e in events if e["time"] > added and e.get("size") == 2 * slots]
    restarted = min(e["at"] for e in events if e["event"] == "started" and e["time"] > added)
    after = [e for e in events if e["time"] > added]
    imported = max(e["time"] for e in after if e["event"] == "imported")
    initialized = max(e["time"] for e in grown if e["event"] == "initialized")
    synced = max(e["time"] for e in grown if e["event"] == "synced")
    restored = min(e["step"] for e in grown if e["event"] == "synced")
    stepped = min(e["time"] for e in grown if e["event"] == "step")
    return {"total_s": stepped - added, "restart_s": restarted - added,
            "import_s": imported - restarted, "rendezvous_s": initialized - imported,
            "checkpoint_s": synced - initialized, "first_step_s": stepped - synced,
            "steps_lost": before - restored}


def bench(trials: int, quick: bool) -> dict[str, Any]:
    params = 1e5 if quick else 1e7
    slots = 1 if quick else 2  # per host; quick: the same paths at half the processes
    runs: dict[str, list[dict[str, Any]]] = {"elasticrun": [], "torchrun": []}
    for _ in range(trials):
        with tempfile.TemporaryDirectory() as tmp:
            runs["elasticrun"].append(elasticrun_trial(params, Path(tmp), slots))
        with tempfile.TemporaryDirectory() as tmp:
            runs["torchrun"].append(torchrun_trial(params, Path(tmp), slots))
    ours = summarize(runs["elasticrun"])
    recovered = [run for run in runs["torchrun"] if "error" not in run]
    failed = [run["error"] for run in runs["torchrun"] if "error" in run]
    theirs = summarize(recovered) if recovered else {}
    note = f"{len(failed)} of {trials} failed: {failed[0][:90]}" if failed else ""
    print_table(
        f"scale-up: {slots} -> {2 * slots} workers (a second host), ~{params / 1e6:g}M "
        f"parameters; "
        f"median of {trials}",
        ["", f"first step at {2 * slots} s", "steps lost", "target s"],
        [["elasticrun", ours["total_s"], ours["steps_lost"],
          f"<= {ours['budget_s']:.2f} (interval {DISCOVERY_INTERVAL_S:g} + start-up "
          f"{ours['own_startup_s']:.2f} + 0.5)"],
         ["torchrun (2nd agent)", theirs.get("total_s", "-"), theirs.get("steps_lost", "-"),
          note]])
    print_table("  elasticrun, broken down (s)", ER_PHASES, [[ours[k] for k in ER_PHASES]])
    if theirs:
        print_table("  torchrun, broken down (s)", TR_PHASES, [[theirs[k] for k in TR_PHASES]])
    return {"median": {"elasticrun": ours, "torchrun": theirs}, "trials": runs}
