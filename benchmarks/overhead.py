"""Steady-state overhead: what being elastic costs while nothing fails.

2 workers on this machine, the same model and batch. The peer is plain DDP under torchrun
(--standalone, no checkpoint). elasticrun runs er_train.py: DistributedOptimizer and a
TorchState committed every step or every 10 steps (and never, to separate the optimizer's
cost from the commit's). Throughput is rank 0's steps per second after a warm-up (the
median over windows of 10 steps); the commit cost is the measured duration of
`state.commit()` itself, for 1M, 10M and 50M parameters (BENCH_OVERHEAD_SIZES, e.g.
"1e6", picks some). Targets: at least 0.95x DDP's throughput committing every 10 steps, and
committing every step at least 0.95x the throughput of never committing, at 1M parameters.
Trials run every config one after the other, every other trial backwards, and each config
is set against the DDP job of its own trial (the median of those ratios, and their range).
Hang detection's steady-state cost: commit/10 with it (the default) against commit/10 with
--no-hang-detection, trial by trial (target: under 1% of the step time).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from benchlib import (
    SCRIPTS,
    Jobs,
    bench_env,
    elasticrun_command,
    free_port,
    median,
    print_table,
    read_events,
    torchrun_command,
)

WARMUP_STEPS = 5
WINDOW = 10
CONFIGS = ("ddp", "commit_never", "commit_10", "commit_1", "commit_10_no_hang_detection")
# --quick (the suite's smoke test): every path the full run takes, in three jobs: torchrun's
# DDP, elasticrun committing (the commit's duration from its commits), and without hang
# detection; "never" and "every step" differ from "every 10" by an environment variable only.
QUICK_CONFIGS = ("ddp", "commit_10", "commit_10_no_hang_detection")


def _throughput(out: Path) -> dict[str, float]:
    """Rank 0's steps per second: the median over windows of WINDOW consecutive steps (each
    window holds one commit every 10 steps), since a hiccup of this shared 2-core machine
    moves a whole-run mean a lot and a median little."""
    steps = [e for e in read_events(out) if e["event"] == "step" and e["rank"] == 0]
    measured = steps[WARMUP_STEPS:]
    times = [e["time"] for e in measured]
    rate = median(WINDOW / (times[i + WINDOW] - times[i])
                  for i in range(0, len(times) - WINDOW, WINDOW))
    commits = [e["commit_s"] for e in measured if e["commit_s"] > 0]
    return {"steps_per_s": rate, "commit_ms": median(commits) * 1e3 if commits else 0.0}


def _paired(runs: list[dict[str, float]], ddp: list[dict[str, float]]) -> dict[str, float]:
    """Throughput against DDP trial by trial (each trial runs every config, one after the
    other): separate jobs on this machine swing by several percent from minute to minute,
    DDP's alone too, so a ratio of two medians taken minutes apart can say less than the
    trials' own ratios and their spread."""
    ratios = [run["steps_per_s"] / base["steps_per_s"] for run, base in zip(runs, ddp,
                                                                           strict=True)]
    return {"median": median(ratios), "min": min(ratios), "max": max(ratios)}


def _against_ddp(rate: float, vs_ddp: dict[str, float]) -> str:
    if vs_ddp["min"] == vs_ddp["max"]:
        return f"{rate:.3f} ({vs_ddp['median']:.2f}x)"
    return f"{rate:.3f} ({vs_ddp['median']:.2f}x, {vs_ddp['min']:.2f}-{vs_ddp['max']:.2f})"


def run_config(config: str, params: float, steps: int,
               extra_env: dict[str, str] | None = None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "events.jsonl"
        every = {"commit_never": 0, "commit_10": 10, "commit_1": 1,
                 "commit_10_no_hang_detection": 10}.get(config, 0)
        env = bench_env({"BENCH_OUT": str(out), "BENCH_PARAMS": f"{params:g}",
                         "BENCH_STEPS": str(steps + WARMUP_STEPS),
                         "BENCH_COMMIT_EVERY": str(every), "BENCH_CHECKPOINT_EVERY": "0",
                         "BENCH_CHECKPOINT_DIR": tmp, **(extra_env or {})})
        if config == "ddp":
            command = torchrun_command(SCRIPTS / "torchrun_train.py", 2, port=free_port())
        else:
            flags = ["--no-hang-detection"] if config.endswith("no_hang_detection") else []
            command = elasticrun_command(["-np", "2", *flags], SCRIPTS / "er_train.py")
        with Jobs() as jobs:
            jobs.start(command, env)
            jobs.wait(900, f"overhead job ({config}, {params:g} parameters)")
        return _throughput(out)


def bench(trials: int, quick: bool) -> dict[str, Any]:
    sizes = {1e5: 21} if quick else {1e6: 501, 1e7: 101, 5e7: 41}
    chosen = os.environ.get("BENCH_OVERHEAD_SIZES")
    if chosen:
        sizes = {size: steps for size, steps in sizes.items()
                 if size in {float(s) for s in chosen.split(",")}} or sizes
    results: dict[str, Any] = {}
    rows = []
    configs = QUICK_CONFIGS if quick else CONFIGS
    for params, steps in sizes.items():
        runs: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
        for trial in range(trials):  # interleaved, every other trial backwards (ABBA)
            for config in configs if trial % 2 == 0 else tuple(reversed(configs)):
                runs[config].append(run_config(config, params, steps))
        rate = {c: median(r["steps_per_s"] for r in runs[c]) for c in configs}
        vs_ddp = {c: _paired(runs[c], runs["ddp"]) for c in configs if c != "ddp"}
        commit_ms = median(r["commit_ms"] for r in runs["commit_1" if "commit_1" in runs
                                                         else "commit_10"])
        # commit/1 against no commit, trial by trial (each trial runs both back to back)
        vs_never = median(every["steps_per_s"] / never["steps_per_s"]
                          for every, never in zip(runs["commit_1"], runs["commit_never"],
                                                  strict=True)) if "commit_1" in runs else None
        hang_cost = median(1 - on["steps_per_s"] / off["steps_per_s"]
                           for on, off in zip(runs["commit_10"],
                                              runs["commit_10_no_hang_detection"], strict=True))
        results[f"{params:g}"] = {"trials": runs, "steps_per_s": rate, "vs_ddp": vs_ddp,
                                  "commit_ms": commit_ms, "commit_1_vs_never": vs_never,
                                  "hang_detection_cost": hang_cost}
        rows.append([f"{params / 1e6:g}M", rate["ddp"],
                     *(_against_ddp(rate[c], vs_ddp[c]) if c in rate else "-"
                       for c in CONFIGS[1:4]),
                     "-" if vs_never is None else f"{vs_never:.2f}x", commit_ms,
                     f"{100 * hang_cost:+.1f}%"])
    print_table(f"overhead: 2 workers, steps/s, median of {trials} (x DDP under torchrun: the "
                f"median of each trial's ratio, and its range)",
                ["params", "DDP", "no commit", "commit/10", "commit/1", "commit/1 vs none",
                 "commit ms", "hang detection"], rows)
    return results
