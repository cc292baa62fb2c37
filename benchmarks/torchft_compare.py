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

import tempfile
from pathlib import Path
from typing import Any

from benchlib import print_table, summarize
from torchft_trial import (
    COMMIT_EVERY,
    ELASTICRUN,
    FAIL_RANK,
    HEARTBEAT_TIMEOUT_MS,
    MANAGER_TIMEOUT_S,
    MIN_WORKERS,
    PG_TIMEOUT_S,
    QUICK_TOOLS,
    QUORUM_TICK_MS,
    TOOLS,
    WORKERS,
    Config,
    Tool,
    trial,
)
from torchft_venv import TORCHFT_VERSION, torchft_python

FAILURES = ("kill", "stop")
HANG_BOUND_S = 120.0  # the failure -> giving up on a resume
QUICK_HANG_BOUND_S = 15.0
KEYS = ("resume_s", "caught_up_s", "steps_lost", "steps_per_s")


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

