"""Benchmarks: `python benchmarks/run.py [recovery] [commit] [--trials N] [--quick]`.

Prints a table of medians over trials and writes the raw numbers as JSON to
benchmarks/results/<name>.json.

recovery  4 workers (localhost:2 + 127.0.0.1:2), one SIGKILLed mid-training: seconds from
          the kill to the first completed step after the reset, broken down into failure
          detection, reset (driver decision + rendezvous + Gloo rebuild), state sync and
          the first step.
commit    2 workers: median step time without and with `state.commit()` (alternating steps
          of one run), for several model sizes: the cost of a commit with no host change.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SCRIPT = HERE / "scripts" / "bench_train.py"
RESULTS = HERE / "results"


def run_job(args: list[str], env: dict[str, str], timeout: float = 300) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "events.jsonl"
        # One intra-op thread per worker: several workers share this machine's cores.
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", **env, "BENCH_OUT": str(out),
                    "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        proc = subprocess.run([sys.executable, "-m", "elasticrun", "--start-timeout", "120",
                               *args, sys.executable, str(SCRIPT)],
                              env=full_env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"benchmark job failed:\n{proc.stderr[-2000:]}")
        return [json.loads(line) for line in out.read_text().splitlines()]


def recovery_trial(params: float, steps: int) -> dict[str, float]:
    events = run_job(["-H", "localhost:2,127.0.0.1:2", "--min-np", "2"],
                     {"BENCH_PARAMS": str(params), "BENCH_STEPS": str(steps),
                      "BENCH_KILL_STEP": str(steps // 2), "BENCH_KILL_RANK": "3"})
    kill = next(e["time"] for e in events if e["event"] == "kill")
    after = [e for e in events if e["time"] > kill]

    def first(kind: str) -> float:
        return min(e["time"] for e in after if e["event"] == kind)

    detected, reset, synced = first("failure"), first("reset"), first("synced")
    resumed = min(e["time"] for e in after if e["event"] == "step" and e["size"] == 2)
    return {
        "total_s": resumed - kill,
        "detection_s": detected - kill,
        "reset_s": reset - detected,
        "sync_s": synced - reset,
        "first_step_s": resumed - synced,
        "params": next(e["params"] for e in events if e["event"] == "done"),
    }


def commit_trial(params: float, steps: int) -> dict[str, float]:
    """Steps alternate with and without a commit in one run, so machine drift cancels."""
    events = run_job(["-np", "2"], {"BENCH_PARAMS": str(params), "BENCH_STEPS": str(steps),
                                    "BENCH_COMMIT_EVERY": "-1"})
    done = [e for e in events if e["event"] == "done"]
    plain = statistics.median(e["median_step_s"] for e in done)
    committed = statistics.median(e["median_commit_step_s"] for e in done)
    return {"step_ms": plain * 1e3, "step_with_commit_ms": committed * 1e3,
            "commit_ms": (committed - plain) * 1e3, "overhead": committed / plain - 1}


def summarize(trials: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(t[key] for t in trials) for key in trials[0]}


def bench_recovery(trials: int, quick: bool) -> dict[str, Any]:
    params, steps = (1e5, 20) if quick else (1e7, 40)
    runs = [recovery_trial(params, steps) for _ in range(trials)]
    median = summarize(runs)
    print(f"\nrecovery: 4 workers, one SIGKILLed, ~{median['params'] / 1e6:.1f}M params, "
          f"median of {trials}")
    for key in ("detection_s", "reset_s", "sync_s", "first_step_s", "total_s"):
        print(f"  {key:<14} {median[key]:8.3f} s")
    return {"trials": runs, "median": median}


def bench_commit(trials: int, quick: bool) -> dict[str, Any]:
    sizes = [1e5] if quick else [1e6, 1e7, 5e7]
    steps = 20 if quick else 100
    table = {}
    print(f"\ncommit: 2 workers, steps with vs without a commit, median of {trials}")
    print(f"  {'params':>8} {'step ms':>9} {'+commit ms':>11} {'commit ms':>10} {'overhead':>9}")
    for size in sizes:
        runs = [commit_trial(size, steps) for _ in range(trials)]
        median = summarize(runs)
        table[f"{size:g}"] = {"trials": runs, "median": median}
        print(f"  {size / 1e6:7.1f}M {median['step_ms']:9.2f} {median['step_with_commit_ms']:11.2f}"
              f" {median['commit_ms']:10.2f} {median['overhead']:8.1%}")
    return table


BENCHMARKS: dict[str, Callable[[int, bool], dict[str, Any]]] = {
    "recovery": bench_recovery,
    "commit": bench_commit,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", choices=[[], *BENCHMARKS], default=[])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one trial (smoke)")
    args = parser.parse_args(argv)
    trials = 1 if args.quick else args.trials
    RESULTS.mkdir(exist_ok=True)
    for name in args.names or list(BENCHMARKS):
        result = BENCHMARKS[name](trials, args.quick)
        (RESULTS / f"{name}{'-quick' if args.quick else ''}.json").write_text(
            json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
