"""Total loss (issue 56): what keeping every commit outside the workers costs, and how fast a
job that loses every worker at once trains again.

`python benchmarks/total_loss.py [--trials N] [--quick] [--large] [--parts throughput,loss]`
prints its tables and writes results/total_loss-<sizes>.json.

1. throughput: a 2-worker job of scripts/er_total_loss_train.py (model.py's MLP, synthetic
   data, SGD with momentum through er.DistributedOptimizer, an er.elastic.TorchState)
   committing every 10 steps and every step, with host snapshots (the default) and with
   --no-host-snapshots; rank 0's steps/s after a warm-up (the median over windows of 10
   steps, each holding one commit every 10) and the median duration of `state.commit()`.
   Trials run the configs one after the other, every other trial backwards; the on/off
   ratio is the median of each trial's own ratio (target: >= 0.98 committing every 10).
2. loss: the same script, every rank SIGKILLing itself at the start of step KILL_STEP (5
   steps after the commit of step 20), once per rank: kill -> the restarted job's first
   step (rank 0), with the default flags (the host snapshot in /dev/shm) and with
   --no-host-snapshots --checkpoint-dir DIR --checkpoint-interval 0 (the fsynced file);
   broken down with the driver's --event-log and the scripts' events.
3. The peer, in the same trials: torchrun (c10d, --max-restarts 1) running
   scripts/torchrun_dcp_train.py (the same model, DDP, torch.distributed.checkpoint save
   every 10 steps, loaded at start), every rank SIGKILLed at the same step; kill -> its
   restarted job's first step, and torchrun / elasticrun.
Sizes: ~1M and ~10M parameters (--large adds ~100M; --quick: ~0.1M, one trial).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import RESULTS, median, print_table  # noqa: E402
from total_loss_jobs import (  # noqa: E402
    COMMIT_EVERY,
    ER_PHASES,
    KILL_STEP,
    LOSS_VARIANTS,
    THROUGHPUT_CONFIGS,
    THROUGHPUT_STEPS,
    TR_PHASES,
    loss_trial,
    throughput_job,
)

TARGET = 0.98  # snapshots on / off, committing every 10


# --- 1. throughput ------------------------------------------------------------------------
def throughput(params: float, trials: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in THROUGHPUT_CONFIGS}
    for trial in range(trials):  # interleaved, every other trial backwards (ABBA)
        order = THROUGHPUT_CONFIGS if trial % 2 == 0 else tuple(reversed(THROUGHPUT_CONFIGS))
        for config in order:
            runs[config].append(throughput_job(config, params))
    result: dict[str, Any] = {"trials": runs}
    for every in ("10", "1"):
        on, off = runs[f"on_{every}"], runs[f"off_{every}"]
        ratios = [a["steps_per_s"] / b["steps_per_s"] for a, b in zip(on, off, strict=True)]
        result[f"every_{every}"] = {
            "on_steps_per_s": median(r["steps_per_s"] for r in on),
            "off_steps_per_s": median(r["steps_per_s"] for r in off),
            "on_commit_ms": median(r["commit_ms"] for r in on),
            "off_commit_ms": median(r["commit_ms"] for r in off),
            "ratio": median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
    return result


def throughput_rows(name: str, result: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for every in ("10", "1"):
        r = result[f"every_{every}"]
        rows.append([name, every, r["off_steps_per_s"], r["on_steps_per_s"],
                     f"{r['ratio']:.3f} ({r['ratio_min']:.3f}-{r['ratio_max']:.3f})",
                     r["off_commit_ms"], r["on_commit_ms"]])
    return rows


# --- 2, 3. a total loss under elasticrun and under torchrun ------------------------------
def total_loss(params: float, trials: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in LOSS_VARIANTS}
    for trial in range(trials):  # interleaved, every other trial backwards
        for variant in LOSS_VARIANTS if trial % 2 == 0 else tuple(reversed(LOSS_VARIANTS)):
            runs[variant].append(loss_trial(params, variant))
    medians: dict[str, dict[str, float]] = {}
    for variant, trial_runs in runs.items():
        ok = [run for run in trial_runs if "error" not in run]
        if ok:
            keys = [k for k, v in ok[0].items() if isinstance(v, (int, float))]
            medians[variant] = {k: median(run[k] for run in ok) for k in keys}
            medians[variant]["resume_min_s"] = min(run["resume_s"] for run in ok)
            medians[variant]["resume_max_s"] = max(run["resume_s"] for run in ok)
    return {"trials": runs, "median": medians}


def loss_rows(name: str, result: dict[str, Any], trials: int) -> list[list[Any]]:
    rows: list[list[Any]] = []
    medians = result["median"]
    peer = medians.get("torchrun + DCP", {}).get("resume_s")
    for variant in LOSS_VARIANTS:
        failed = [run["error"] for run in result["trials"][variant] if "error" in run]
        note = f"{len(failed)} of {trials} failed: {failed[0][:90]}" if failed else ""
        if variant not in medians:
            rows.append([name, variant, "-", "-", "-", "-", note])
            continue
        m = medians[variant]
        ratio = "" if peer is None or variant.startswith("torchrun") else \
            f"{peer / m['resume_s']:.2f}x"
        rows.append([name, variant, m["resume_s"],
                     f"{m['resume_min_s']:.2f}-{m['resume_max_s']:.2f}", ratio,
                     int(m["steps_lost"]), note])
    return rows


def phase_rows(name: str, result: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for variant in LOSS_VARIANTS:
        m = result["median"].get(variant)
        if m is None:
            continue
        phases = TR_PHASES if variant.startswith("torchrun") else ER_PHASES
        rows.append([name, variant, "  ".join(f"{p.removesuffix('_s')} {m[p]:.2f}"
                                              for p in phases)])
    return rows


# --- the benchmark ------------------------------------------------------------------------
def sizes(quick: bool, large: bool) -> list[float]:
    if quick:
        return [1e5]
    return [1e6, 1e7, 1e8] if large else [1e6, 1e7]


def label(params: float) -> str:
    return f"~{params / 1e6:g}M"


def run_parts(parts: Sequence[str], chosen: list[float], trials: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    jobs: dict[str, Callable[[float, int], dict[str, Any]]] = {"throughput": throughput,
                                                               "loss": total_loss}
    for part in parts:
        results[part] = {f"{params:g}": jobs[part](params, trials) for params in chosen}
    return results


def print_results(results: dict[str, Any], trials: int) -> None:
    if "throughput" in results:
        rows = [row for size, r in results["throughput"].items()
                for row in throughput_rows(label(float(size)), r)]
        print_table(f"total loss, part 1: the commit's cost, 2 workers, rank 0's steps/s, median "
                    f"of {trials} (on/off: median of each trial's ratio, and its range; target "
                    f">= {TARGET} committing every 10)",
                    ["params", "commit every", "no snapshots", "host snapshots", "on/off",
                     "commit ms off", "commit ms on"], rows)
    if "loss" in results:
        rows = [row for size, r in results["loss"].items()
                for row in loss_rows(label(float(size)), r, trials)]
        print_table(f"total loss, parts 2-3: every worker of 2 SIGKILLed at step {KILL_STEP} "
                    f"(commit/checkpoint every {COMMIT_EVERY}): kill -> the restarted job's "
                    f"first step, median of {trials} (min-max)",
                    ["params", "kept in", "resume s", "min-max", "torchrun / this",
                     "steps lost", ""], rows)
        rows = [row for size, r in results["loss"].items()
                for row in phase_rows(label(float(size)), r)]
        print_table("  where the time goes (s, medians): elasticrun kill -> worker_failed "
                    "(detection) -> total_loss (decision) -> round_started (round) -> first "
                    "new worker's first line (spawn) -> every rank synced, state restored "
                    "(setup) -> first step; torchrun kill -> first new worker's first line "
                    "(restart) -> torch imported, process group built (imports_init) -> DCP "
                    "loaded (load) -> first step",
                    ["params", "kept in", "phases"], rows)


def bench(trials: int, quick: bool, large: bool = False,
          parts: Sequence[str] = ("throughput", "loss"),
          only: list[float] | None = None) -> dict[str, Any]:
    results = run_parts(parts, only or sizes(quick, large), 1 if quick else trials)
    print_results(results, 1 if quick else trials)
    return {"trials": 1 if quick else trials, "kill_step": KILL_STEP,
            "commit_every": COMMIT_EVERY, **results}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="~0.1M parameters, one trial")
    parser.add_argument("--large", action="store_true", help="~100M parameters too")
    parser.add_argument("--parts", default="throughput,loss",
                        help="comma-separated: throughput, loss [default: both]")
    parser.add_argument("--sizes", default="",
                        help="comma-separated parameter counts of its own, e.g. 1e8 "
                             "(each of 1e5, 1e6, 1e7, 1e8) [default: 1e6,1e7]")
    args = parser.parse_args(argv)
    only = [float(size) for size in args.sizes.split(",") if size]
    if any(size not in THROUGHPUT_STEPS for size in only):
        parser.error(f"--sizes {args.sizes}: expected some of 1e5, 1e6, 1e7, 1e8")
    parts = [part for part in args.parts.split(",") if part]
    unknown = [part for part in parts if part not in ("throughput", "loss")]
    if unknown:
        parser.error(f"unknown part {unknown[0]!r}; expected throughput or loss")
    result = bench(args.trials, args.quick, args.large, parts, only)
    chosen = "quick" if args.quick else "-".join(label(s).strip("~") for s in
                                                  only or sizes(False, args.large))
    name = f"total_loss-{chosen}{'' if len(parts) == 2 else '-' + '-'.join(parts)}.json"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / name).write_text(json.dumps(result, indent=2))
    print(f"\nwritten: {RESULTS / name}")


if __name__ == "__main__":
    main()
