"""Part e of benchmarks/hsdp.py: torchft's HSDP on this machine's CPUs, the kill of part a.

torchft (TORCHFT_VERSION, from PyPI into the side venv benchmarks/.venv-torchft, torchft_venv.py)
has no HSDP launcher of its own in 0.2.0: its FSDP test (fsdp_test.py, GPU only, a mocked
Manager) and torchtitan's integration shard with FSDP2 inside a replica group and hand each
reduce-scattered gradient to the Manager through FSDP's all-reduce hook, which is what
scripts/torchft_hsdp_train.py does: 2 replica groups of 2 ranks, each group its own Gloo
group and TCPStore, a Lighthouse started here (--min_replicas 1, --join_timeout_ms JOIN_MS,
--quorum_tick_ms 100), ProcessGroupGloo(timeout = PG_TIMEOUT_S), Manager timeout 30 s.
JOIN_MS and PG_TIMEOUT_S are the tightest that benchmarks/torchft_compare.py measured
(torchft's defaults wait longer). Rank 3 SIGKILLs itself at the start of step hsdp.KILL_STEP,
once the step's quorum holds its group; nothing restarts its group (torchft leaves that to
torchrun, and part a measures the survivors only).
With 2 replica groups the Lighthouse forms no quorum of 1 group while the other still
heartbeats ("need at least half of 2 healthy workers"): the lost group's heartbeat timeout
bounds the recovery, so two variants run: --heartbeat_timeout_ms 5000 (torchft's default;
timeout-bound, so one trial) and 1000 (`trials` trials).
Measured: kill -> the first step a survivor commits after it, and rank 0's median step
before the kill (steps 2 to the kill).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import SCRIPTS, Jobs, bench_env, free_port, median, print_table, read_events
from torchft_venv import TORCHFT_VERSION, torchft_python

SCRIPT = SCRIPTS / "torchft_hsdp_train.py"
GROUPS, GROUP_SIZE = 2, 2
JOIN_MS = 1000
PG_TIMEOUT_S = 1.0
HEARTBEATS_MS = (5000, 1000)  # the lighthouse's --heartbeat_timeout_ms: its default, tight
START_BOUND_S = 120.0  # start -> the kill
RESUME_BOUND_S = 60.0  # the kill -> giving up


def trial(python: Path, size: str, kill_step: int, heartbeat_ms: int,
          tmp: Path) -> dict[str, Any]:
    out = tmp / "events.jsonl"
    barrier = tmp / "barrier"
    barrier.mkdir()
    lighthouse = free_port()
    env = bench_env({"BENCH_OUT": str(out), "BENCH_SIZE": size, "BENCH_STEPS": "1000",
                     "BENCH_KILL_STEP": str(kill_step),
                     "BENCH_KILL_RANK": str(GROUPS * GROUP_SIZE - 1),
                     "BENCH_PG_TIMEOUT_S": str(PG_TIMEOUT_S), "BENCH_BARRIER_DIR": str(barrier),
                     "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{lighthouse}",
                     "TORCHFT_USE_OTEL": "false", "NUM_REPLICA_GROUPS": str(GROUPS),
                     "GROUP_SIZE": str(GROUP_SIZE)})
    with Jobs() as jobs:
        jobs.start([str(python.parent / "torchft_lighthouse"), "--bind",
                    f"127.0.0.1:{lighthouse}", "--min_replicas", "1", "--join_timeout_ms",
                    str(JOIN_MS), "--quorum_tick_ms", "100", "--heartbeat_timeout_ms",
                    str(heartbeat_ms)], env)
        for group in range(GROUPS):
            port = free_port()
            for group_rank in range(GROUP_SIZE):
                jobs.start([str(python), str(SCRIPT)],
                           {**env, "REPLICA_GROUP_ID": str(group), "GROUP_RANK": str(group_rank),
                            "GROUP_STORE_PORT": str(port)})
        return _watch(jobs, out)


def _watch(jobs: Jobs, out: Path) -> dict[str, Any]:
    """Follows the events until a survivor commits a step after the kill, or a bound passes;
    a survivor that exits first is a result too."""
    start, killed_at = time.monotonic(), None
    while True:
        events = read_events(out)
        kill = next((e for e in events if e["event"] == "kill"), None)
        if kill is not None:
            killed_at = killed_at or time.monotonic()
            survivors = [e for e in events if e["event"] == "step" and e["time"] > kill["time"]
                         and e["step"] > kill["step"] and e["rank"] < GROUP_SIZE]
            if survivors:
                return _outcome(events, kill, survivors[0])
            if time.monotonic() - killed_at > RESUME_BOUND_S:
                return {"error": f"no survivor's step within {RESUME_BOUND_S:g} s of the kill"}
        elif time.monotonic() - start > START_BOUND_S:
            return {"error": f"no kill within {START_BOUND_S:g} s of the start: "
                             f"{_first_error(jobs)}"}
        if kill is None and any(proc.poll() is not None for proc in jobs.procs):
            return {"error": f"a process exited before the kill: {_first_error(jobs)}"}
        time.sleep(0.1)


def _first_error(jobs: Jobs) -> str:
    for proc, log in zip(jobs.procs, jobs.logs, strict=True):
        if proc.poll() is not None:
            log.seek(0)
            lines = [line.strip() for line in log.read().splitlines() if "Error" in line]
            return f"exit {proc.returncode}: {lines[-1][:200] if lines else ''}"
    return "none exited"


def _outcome(events: list[dict[str, Any]], kill: dict[str, Any],
             resumed: dict[str, Any]) -> dict[str, Any]:
    before = [e["time"] for e in events if e["event"] == "step" and e["rank"] == 0
              and 2 <= e["step"] <= kill["step"]]
    intervals = [b - a for a, b in zip(before, before[1:], strict=False)]
    refused = sum(e["event"] == "failure" and e["rank"] < GROUP_SIZE for e in events)
    return {"resume_s": resumed["time"] - kill["time"],
            "steady_step_s": median(intervals) if intervals else 0.0,
            "refused_steps": refused, "size_after": resumed["size"]}


def torchft_recovery(size: str, kill_step: int, trials: int, quick: bool,
                     ours: dict[str, Any] | None) -> dict[str, Any]:
    """Part e: torchft's trials (none in quick mode), against part a's elastic HSDP."""
    if quick:
        print("\ne. torchft: skipped in quick mode", flush=True)
        return {"skipped": "quick mode"}
    python = torchft_python()
    if isinstance(python, str):
        print(f"\ne. torchft: skipped: {python}", flush=True)
        return {"skipped": python}
    runs: dict[str, list[dict[str, Any]]] = {}
    for heartbeat_ms in HEARTBEATS_MS:
        runs[str(heartbeat_ms)] = []
        for _ in range(1 if heartbeat_ms == HEARTBEATS_MS[0] else trials):
            with tempfile.TemporaryDirectory() as tmp:
                runs[str(heartbeat_ms)].append(trial(python, size, kill_step, heartbeat_ms,
                                                     Path(tmp)))
    hsdp = ours["median"]["hsdp"] if ours else None
    rows: list[list[Any]] = []
    if hsdp:
        rows.append(["elasticrun (part a)", "", hsdp["resume_s"], "", hsdp["steady_step_s"],
                     ""])
    medians = {}
    for heartbeat_ms, trials_run in runs.items():
        ok = [run for run in trials_run if "error" not in run]
        failed = [run["error"] for run in trials_run if "error" in run]
        note = f"{len(failed)} of {len(trials_run)} failed: {failed[0][:120]}" if failed else ""
        name = f"torchft {TORCHFT_VERSION}, heartbeat {int(heartbeat_ms) / 1e3:g} s"
        if not ok:
            rows.append([name, 0, "-", "-", "-", note])
            continue
        resume = median(r["resume_s"] for r in ok)
        medians[heartbeat_ms] = {"resume_s": resume,
                                 "steady_step_s": median(r["steady_step_s"] for r in ok)}
        rows.append([name, len(ok), resume, f"{resume / hsdp['resume_s']:.2f}x" if hsdp else "",
                     medians[heartbeat_ms]["steady_step_s"], note])
    print_table(f"e. torchft HSDP, 2 groups x 2, {size} parameters, rank 3 SIGKILLed at step "
                f"{kill_step}: kill -> a survivor's first committed step, median of n (lighthouse "
                f"--join_timeout_ms {JOIN_MS}, ProcessGroupGloo timeout {PG_TIMEOUT_S:g} s)",
                ["", "n", "resume s", "vs elasticrun", "step s before", ""], rows)
    print("  with 2 groups torchft's lighthouse waits for the lost group's heartbeat to time "
          "out before a quorum of 1 (its default --heartbeat_timeout_ms is 5000)", flush=True)
    return {"version": TORCHFT_VERSION, "join_timeout_ms": JOIN_MS,
            "pg_timeout_s": PG_TIMEOUT_S, "median": medians, "trials": runs}
