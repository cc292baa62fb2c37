"""elasticrun against torchft: the same job loses one of 4 workers mid-training.

Both train the same ~1M-parameter MLP (model.py: synthetic data, batch 32 per worker, SGD,
OMP_NUM_THREADS=1) on 4 CPU workers of this machine, over Gloo on loopback. In each trial
worker 3 fails in the middle of step FAIL_STEP (after its forward pass, before the
gradients' allreduce; under torchft once that step's quorum holds it, so that in both the
survivors meet the failure in the allreduce), either
  kill   SIGKILL: a crash;
  stop   SIGSTOP: a hang (the process keeps its sockets open and answers nothing; the
         benchmark SIGKILLs it when the trial ends).
Measured from the survivors' events (scripts/failure.py's event gives the failure's time):
  resume s     the failure -> the first training step any survivor completes after it
               (torchft: the first step committed after it; elasticrun: the first step
               after the survivors restored the last commit, which may replay a step);
  caught up s  the failure -> the first completed step beyond the one it interrupted;
  steps lost   work redone by a survivor: committed steps rolled back plus attempts
               thrown away (torchft refuses the commit of the step in flight);
  steps/s      steady throughput at 4 workers before the failure: rank 0's steps from
               WARMUP_STEPS to FAIL_STEP - 1 (the same steps for both; the median over
               windows of COMMIT_EVERY steps).
A trial gives up HANG_BOUND_S after the failure (quick mode: QUICK_HANG_BOUND_S) and says
so; a job whose survivors crash is reported as such.

elasticrun: `python -m elasticrun -np 4 --min-np 3 -H localhost:1,127.0.0.1:1,127.0.0.2:1,
127.0.0.3:1` (one slot per host, so the failed host alone is dropped) running
scripts/er_ft_train.py: elasticrun.torch's DistributedOptimizer and a TorchState committed
every COMMIT_EVERY steps (the failure comes halfway between two commits), its defaults
otherwise: hang detection on (--hang-timeout 5 s, which a local worker's /proc state makes
moot), --collective-timeout 60 s (what bounds a hang's detection without it).

torchft (TORCHFT_VERSION, from PyPI into a side venv, benchmarks/.venv-torchft, that
reuses the project's torch through a .pth file; created on first use, never part of the
project's dependencies; if it cannot be installed, elasticrun is reported alone), set up
as its train_ddp.py example and README: 4 replica groups of one worker
(scripts/torchft_train.py), each hosting its group's TCPStore; a Lighthouse started by the
benchmark (torchft_lighthouse --min_replicas 3, so that 3 survivors go on;
--quorum_tick_ms 100, the README's; --heartbeat_timeout_ms 5000, its default); a Manager
with min_replica_size 3, timeout 30 s (train_ddp.py's; collectives, should_commit),
quorum_timeout 60 s, connect_timeout 60 s, heartbeat_interval 100 ms, use_async_quorum
(defaults); torchft.ProcessGroupGloo(timeout=5 s) (train_ddp.py's); torchft.Optimizer
(OptimizerWrapper) over SGD; the gradients through one Manager.allreduce of all of them
(its fault-tolerant allreduce: an error refuses the step's commit; what DDP's single
bucket does). Variants:
  torchft                       --join_timeout_ms 60000, its default (the README's 10000
                                measured the same: the wait below ends first);
  torchft (join 1 s)            --join_timeout_ms 1000, the tightest tried;
  torchft (join 1 s, Gloo 1 s)  and ProcessGroupGloo(timeout=1 s): after a failure some
                                survivor waits in the ring for a peer that has already left
                                the allreduce, so the Gloo timeout bounds every recovery;
  torchft DDP wrapper           torchft.DistributedDataParallel, its recommended wrapper,
                                defaults otherwise: as shipped in 0.2.0 its comm hook
                                asserts when the allreduce fails (ddp.py, `assert
                                fut._fut`), so its survivors crash instead of recovering.
Quick mode runs elasticrun and the tightest torchft alone, a stop only. BENCH_TORCHFT=0
runs elasticrun alone (the suite's smoke test: no side venv, no download).
The replica groups wait for each other (a file barrier) before their first step so that
the first quorum holds all 4; elasticrun starts all 4 in its first round by itself.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import signal
import site
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib import (
    HERE,
    PYTHON,
    REPO,
    SCRIPTS,
    Jobs,
    bench_env,
    elasticrun_command,
    free_port,
    median,
    print_table,
    read_events,
    summarize,
    tagged_pids,
)

TORCHFT_VERSION = "0.2.0"
VENV = HERE / ".venv-torchft"
WORKERS = 4
MIN_WORKERS = 3
FAIL_RANK = 3
COMMIT_EVERY = 10
WARMUP_STEPS = 4
FAILURES = ("kill", "stop")
START_BOUND_S = 120.0  # start -> the failure
HANG_BOUND_S = 120.0  # the failure -> giving up on a resume
QUICK_HANG_BOUND_S = 15.0
KEYS = ("resume_s", "caught_up_s", "steps_lost", "steps_per_s")
# torchft's settings (see the docstring); the lighthouse's join timeout varies per tool.
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


def torchft_python() -> Path | str:
    """The side venv's interpreter with torchft installed (installing it on first use), or
    why there is none."""
    if os.environ.get("BENCH_TORCHFT") == "0":
        return "BENCH_TORCHFT=0"
    python = VENV / "bin" / "python"
    if _torchft_ready(python):
        return python
    print(f"installing torchft=={TORCHFT_VERSION} into {VENV.relative_to(REPO)} (once)",
          flush=True)
    try:
        _run([PYTHON, "-m", "venv", "--clear", str(VENV)], 120)
        purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                        "['purelib'])"], 60).strip()
        # The project's site-packages after the side venv's own: its torch is reused, and
        # nothing is installed into the project's environment.
        Path(purelib, "_elasticrun_project.pth").write_text("\n".join(site.getsitepackages())
                                                            + "\n")
        _run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
              "-c", str(REPO / "constraints.txt"), f"torchft=={TORCHFT_VERSION}"], 600)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"could not install torchft=={TORCHFT_VERSION}: {_reason(exc)}"
    if not _torchft_ready(python):
        return f"torchft=={TORCHFT_VERSION} installed but pip brought its own torch"
    return python


def _torchft_ready(python: Path) -> bool:
    """torchft at the pinned version, next to the project's own torch (checked without
    importing either: that takes seconds)."""
    torch = importlib.util.find_spec("torch")
    probe = ("import importlib.metadata as m, importlib.util as u; "
             "print(m.version('torchft'), u.find_spec('torch').origin)")
    try:
        found = _run([str(python), "-c", probe], 60).split()
    except (OSError, subprocess.SubprocessError):
        return False
    return torch is not None and found == [TORCHFT_VERSION, torch.origin]


def _run(command: Sequence[str], timeout: float) -> str:
    return subprocess.run(list(command), capture_output=True, text=True, timeout=timeout,
                          check=True).stdout


def _reason(exc: BaseException) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        lines = [line for line in (exc.stderr or "").splitlines() if line.strip()]
        return lines[-1].strip()[:200] if lines else f"exit {exc.returncode}"
    return str(exc)[:200]


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


def _medians(runs: list[dict[str, Any]]) -> dict[str, float] | None:
    ok = [run for run in runs if "error" not in run]
    return summarize(ok) if ok else None


def _ratio(theirs: dict[str, float] | None, ours: dict[str, float] | None, key: str,
           bound: float | None = None) -> str:
    """torchft / elasticrun; where elasticrun gave up at `bound`, an upper bound."""
    if theirs is None:
        return "-"
    if ours is not None:
        return f"{theirs[key] / ours[key]:.2f}x"
    return f"<{theirs[key] / bound:.2f}x" if bound else "-"


def _note(runs: list[dict[str, Any]]) -> str:
    failed = [run["error"] for run in runs if "error" in run]
    return f"{len(failed)} of {len(runs)}: {failed[0]}" if failed else ""


def report(runs: dict[str, dict[str, list[dict[str, Any]]]], trials: int,
           config: Config) -> dict[str, dict[str, dict[str, float] | None]]:
    medians = {tool: {failure: _medians(r) for failure, r in by_failure.items()}
               for tool, by_failure in runs.items()}
    rows: list[list[Any]] = []
    for failure in next(iter(runs.values())):
        ours = medians[ELASTICRUN.name][failure]
        gave_up = all("bound_s" in run for run in runs[ELASTICRUN.name][failure])
        for tool, by_failure in runs.items():
            m = medians[tool][failure]
            numbers = ["-"] * 4 if m is None else [m[key] for key in KEYS]
            ratios = ["", ""] if tool == ELASTICRUN.name else [
                _ratio(m, ours, "resume_s", config.hang_bound_s if gave_up else None),
                _ratio(m, ours, "steps_per_s")]
            rows.append([failure, tool, *numbers, *ratios, _note(by_failure[failure])])
    alone = list(runs) == [ELASTICRUN.name]
    print_table(f"{'elasticrun' if alone else f'torchft {TORCHFT_VERSION} vs elasticrun'}: "
                f"{WORKERS} CPU workers, ~1M "
                f"parameters, worker {FAIL_RANK} fails at step {config.fail_step} (kill: "
                f"SIGKILL, stop: SIGSTOP); median of {trials}",
                ["", "", "resume s", "caught up s", "steps lost", "steps/s", "resume ratio",
                 "steps/s ratio", ""], rows)
    torchft = "" if alone else (
        f"ratios: torchft / elasticrun. torchft: lighthouse --min_replicas {MIN_WORKERS} "
        f"--heartbeat_timeout_ms {HEARTBEAT_TIMEOUT_MS} --quorum_tick_ms {QUORUM_TICK_MS}; "
        f"ProcessGroupGloo timeout {PG_TIMEOUT_S:g} s unless named; Manager timeout "
        f"{MANAGER_TIMEOUT_S:g} s, quorum_timeout 60 s, heartbeat_interval 100 ms. ")
    print(f"  {torchft}elasticrun: commit every {COMMIT_EVERY} steps, defaults (hang "
          "detection, --collective-timeout 60 s).", flush=True)
    return medians


def settings() -> dict[str, Any]:
    return {"torchft_version": TORCHFT_VERSION, "workers": WORKERS, "min_workers": MIN_WORKERS,
            "heartbeat_timeout_ms": HEARTBEAT_TIMEOUT_MS, "quorum_tick_ms": QUORUM_TICK_MS,
            "pg_timeout_s": PG_TIMEOUT_S, "manager_timeout_s": MANAGER_TIMEOUT_S,
            "quorum_timeout_s": 60, "heartbeat_interval_ms": 100,
            "join_timeout_ms": {tool.name: tool.join_timeout_ms for tool in TOOLS[1:]},
            "pg_timeout_s_per_tool": {tool.name: tool.pg_timeout_s for tool in TOOLS[1:]},
            "elasticrun_commit_every": COMMIT_EVERY, "elasticrun_collective_timeout_s": 60}


def bench(trials: int, quick: bool) -> dict[str, Any]:
    config = (Config(fail_step=15, hang_bound_s=QUICK_HANG_BOUND_S) if quick
              else Config(fail_step=65, hang_bound_s=HANG_BOUND_S))
    python = torchft_python()
    tools: tuple[Tool, ...] = QUICK_TOOLS if quick else TOOLS
    if isinstance(python, str):
        print(f"torchft: {python}; reporting elasticrun alone", flush=True)
        tools = (ELASTICRUN,)
    failures = ("stop",) if quick else FAILURES  # quick: the recovery smoke has a kill
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        tool.name: {failure: [] for failure in failures} for tool in tools}
    for _ in range(trials):  # interleaved, so that drift of the machine hits all
        for failure in failures:
            for tool in tools:
                with tempfile.TemporaryDirectory() as tmp:
                    runs[tool.name][failure].append(trial(
                        tool, failure, config, python if isinstance(python, Path) else None,
                        Path(tmp)))
    medians = report(runs, trials, config)
    return {"settings": settings(), "fail_step": config.fail_step,
            "torchft": str(python) if isinstance(python, str) else "installed",
            "median": medians, "trials": runs}

