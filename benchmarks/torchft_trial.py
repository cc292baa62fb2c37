"""One trial of benchmarks/torchft_compare.py: the job (elasticrun's or torchft's) with
its failure, followed through its workers' events to the outcome."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib import (
    SCRIPTS,
    Jobs,
    bench_env,
    elasticrun_command,
    free_port,
    median,
    read_events,
    tagged_pids,
)

WORKERS = 4
MIN_WORKERS = 3
FAIL_RANK = 3
COMMIT_EVERY = 10
WARMUP_STEPS = 4
START_BOUND_S = 120.0  # start -> the failure
# torchft's settings (see torchft_compare's docstring); the lighthouse's join timeout varies
# per tool.
HEARTBEAT_TIMEOUT_MS = 5000
QUORUM_TICK_MS = 100
PG_TIMEOUT_S = 5.0
MANAGER_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Tool:
    name: str
    join_timeout_ms: int = 0  # torchft's lighthouse; 0: elasticrun
    pg_timeout_s: float = PG_TIMEOUT_S  # torchft's ProcessGroupGloo
    path: str = "allreduce"  # torchft's gradient path: "allreduce" or "ddp" (its wrapper)


ELASTICRUN = Tool("elasticrun")
TIGHTEST = Tool("torchft (join 1 s, Gloo 1 s)", 1000, 1.0)
TOOLS = (ELASTICRUN, Tool("torchft", 60000), Tool("torchft (join 1 s)", 1000), TIGHTEST,
         Tool("torchft DDP wrapper", 60000, path="ddp"))
QUICK_TOOLS = (ELASTICRUN, TIGHTEST)


@dataclass(frozen=True)
class Config:
    fail_step: int
    hang_bound_s: float

    @property
    def steps(self) -> int:
        return self.fail_step + 20


def _env(out: Path, failure: str, config: Config) -> dict[str, str]:
    return bench_env({"BENCH_OUT": str(out), "BENCH_PARAMS": "1e6",
                      "BENCH_STEPS": str(config.steps), "BENCH_FAILURE": failure,
                      "BENCH_FAIL_STEP": str(config.fail_step),
                      "BENCH_FAIL_RANK": str(FAIL_RANK),
                      "BENCH_COMMIT_EVERY": str(COMMIT_EVERY)})


def _start_elasticrun(jobs: Jobs, env: dict[str, str]) -> None:
    hosts = ",".join(f"{host}:1" for host in ("localhost", "127.0.0.1", "127.0.0.2",
                                              "127.0.0.3"))
    jobs.start(elasticrun_command(["-np", str(WORKERS), "--min-np", str(MIN_WORKERS),
                                   "-H", hosts], SCRIPTS / "er_ft_train.py"), env)


def _start_torchft(jobs: Jobs, env: dict[str, str], tool: Tool, python: Path,
                   tmp: Path) -> None:
    port = free_port()
    jobs.start([str(python.parent / "torchft_lighthouse"), "--bind", f"127.0.0.1:{port}",
                "--min_replicas", str(MIN_WORKERS), "--join_timeout_ms",
                str(tool.join_timeout_ms), "--quorum_tick_ms", str(QUORUM_TICK_MS),
                "--heartbeat_timeout_ms", str(HEARTBEAT_TIMEOUT_MS)], env)
    barrier = tmp / "barrier"
    barrier.mkdir()
    common = {**env, "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{port}",
              "TORCHFT_USE_OTEL": "false", "NUM_REPLICA_GROUPS": str(WORKERS),
              "BENCH_MIN_REPLICAS": str(MIN_WORKERS), "BENCH_PG_TIMEOUT_S": str(tool.pg_timeout_s),
              "BENCH_MANAGER_TIMEOUT_S": str(MANAGER_TIMEOUT_S),
              "BENCH_BARRIER_DIR": str(barrier), "BENCH_TORCHFT_PATH": tool.path}
    for replica in range(WORKERS):
        jobs.start([str(python), str(SCRIPTS / "torchft_train.py")],
                   {**common, "REPLICA_GROUP_ID": str(replica)})


def trial(tool: Tool, failure: str, config: Config, python: Path | None,
          tmp: Path) -> dict[str, Any]:
    """One job, one failure; a job that does not recover in time is a result too."""
    out = tmp / "events.jsonl"
    env = _env(out, failure, config)
    with Jobs() as jobs:
        try:
            if tool is ELASTICRUN:
                _start_elasticrun(jobs, env)
            else:
                assert python is not None
                _start_torchft(jobs, env, tool, python, tmp)
            return _watch(jobs, out, failure, config)
        finally:
            _kill_failed(jobs, out, failure)


def _kill_failed(jobs: Jobs, out: Path, failure: str) -> None:
    """SIGKILLs the stopped worker: a SIGTERM would wait for it to be continued."""
    failed = [e["pid"] for e in read_events(out) if e["event"] == failure]
    for pid in set(failed) & set(tagged_pids(jobs.tag)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _watch(jobs: Jobs, out: Path, failure: str, config: Config) -> dict[str, Any]:
    """Follows the job's events until a survivor completes a step beyond the interrupted
    one, a survivor exits, or a bound passes."""
    start = time.monotonic()
    failed_at: float | None = None
    while True:
        # Exits first: a worker that failed has written its event before it went.
        exited = [(proc, log) for proc, log in zip(jobs.procs, jobs.logs, strict=True)
                  if proc.poll() is not None]
        events = read_events(out)
        failed = next((e for e in events if e["event"] == failure), None)
        if failed is not None:
            failed_at = failed_at or time.monotonic()
            if _caught_up(events, failed):
                return _outcome(events, failed)
            if time.monotonic() - failed_at > config.hang_bound_s:
                return {"error": f"no step within {config.hang_bound_s:g} s of the failure",
                        "bound_s": config.hang_bound_s}
        elif time.monotonic() - start > START_BOUND_S:
            return {"error": f"no failure within {START_BOUND_S:g} s of the start"}
        exited = [(p, log) for p, log in exited if not failed or p.pid != failed["pid"]]
        if exited:
            return {"error": _exit_reason(*exited[0])}
        time.sleep(0.1)


def _exit_reason(proc: subprocess.Popen[str], log: Any) -> str:
    """The exit status and the last error line of the log (with the frame raising it)."""
    log.seek(0)
    lines = [line.strip() for line in log.read().splitlines() if line.strip()]
    errors = [i for i, line in enumerate(lines) if "Error" in line]
    if not errors:
        return f"exited {proc.returncode} early"
    at = errors[-1]
    frame = next((lines[i] for i in range(at - 1, -1, -1) if lines[i].startswith("File ")),
                 "")
    where = frame.split("site-packages/")[-1].replace('"', "") if frame else ""
    return f"exit {proc.returncode}: {lines[at][:120]} ({where[:80]})"


def _after(events: list[dict[str, Any]], failed: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in events if e["time"] > failed["time"] and e["pid"] != failed["pid"]]


def _caught_up(events: list[dict[str, Any]], failed: dict[str, Any]) -> bool:
    return any(e["event"] == "step" and e["step"] > failed["step"]
               for e in _after(events, failed))


def _outcome(events: list[dict[str, Any]], failed: dict[str, Any]) -> dict[str, Any]:
    t, interrupted = failed["time"], failed["step"]
    after = _after(events, failed)
    # A step completed after the failure counts once it is beyond the interrupted step or
    # follows its worker's restore; before that it is a step finished as the failure came.
    restored: set[int] = set()
    resumed = None
    for e in after:
        if e["event"] == "synced":
            restored.add(e["pid"])
        elif e["event"] == "step" and (e["step"] > interrupted or e["pid"] in restored):
            resumed = e
            break
    assert resumed is not None
    caught_up = next(e for e in after if e["event"] == "step" and e["step"] > interrupted)
    thrown_away = sum(e["event"] == "failure" and e["pid"] == resumed["pid"]
                      and e["time"] < resumed["time"] for e in after)
    return {"resume_s": resumed["time"] - t, "caught_up_s": caught_up["time"] - t,
            "steps_lost": interrupted - (resumed["step"] - 1) + thrown_away,
            "steps_per_s": _throughput(events, failed), "size_after": resumed["size"]}


def _throughput(events: list[dict[str, Any]], failed: dict[str, Any]) -> float:
    """Rank 0's steps per second at 4 workers: the median over windows of COMMIT_EVERY
    steps (each holds one of elasticrun's commits), since a hiccup of this shared machine
    moves a whole-run mean a lot and a median little."""
    steps = {e["step"]: e["time"] for e in events if e["event"] == "step" and e["rank"] == 0
             and e["time"] < failed["time"] and e["size"] == WORKERS}
    # Rank 0 may finish the step before the failure's only after the failure's event.
    edges = range(WARMUP_STEPS, failed["step"], COMMIT_EVERY)
    return median(COMMIT_EVERY / (steps[b] - steps[a]) for a, b in itertools.pairwise(edges))
