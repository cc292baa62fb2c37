"""Part 2 of benchmarks/flash.py, the cost per step, from the benchmark's side: the sizes,
flash_cost.py's trials at every size (run in a process of its own), their summary and table.

BENCH_FLASH_SIZES (e.g. "1e6,1e7") picks some sizes.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

from benchlib import HERE, PYTHON, bench_env, median, print_table

COST_SCRIPT = HERE / "flash_cost.py"
COST_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class Size:
    params: float
    warmup: int
    steps: int


def sizes(quick: bool) -> list[Size]:
    found = [Size(1e6, 10, 120), Size(1e7, 3, 9)] if quick else \
        [Size(1e6, 20, 400), Size(1e7, 10, 60), Size(1e8, 6, 40)]
    chosen = os.environ.get("BENCH_FLASH_SIZES")
    if chosen:
        wanted = {float(s) for s in chosen.split(",")}
        found = [size for size in found if size.params in wanted] or found
    return found


def cost_runs(all_sizes: list[Size], trials: int) -> list[dict[str, Any]]:
    """flash_cost.py's trials at every size, in one process of its own (a torch import)."""
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="elasticrun-bench-flash-") as tmp:
        proc = subprocess.run([PYTHON, str(COST_SCRIPT),
                               "--params", *(f"{s.params:g}" for s in all_sizes),
                               "--warmup", *(str(s.warmup) for s in all_sizes),
                               "--steps", *(str(s.steps) for s in all_sizes),
                               "--trials", str(trials), "--directory", tmp],
                              env=bench_env(), capture_output=True, text=True,
                              timeout=COST_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"flash_cost.py failed (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[-2000:]}")
    found: list[dict[str, Any]] = json.loads(proc.stdout.splitlines()[-1])["sizes"]
    return found


def cost_summary(result: dict[str, Any]) -> dict[str, Any]:
    trials = result["trials"]
    ons = [t["on"] for t in trials]
    ratios = [t["on"]["steps_per_s"] / t["off"]["steps_per_s"] for t in trials]
    steady = [s for on in ons for s in on["commit_call_s"][1:]]  # the buffers exist
    return {"params": result["params"],
            "off_steps_per_s": median(t["off"]["steps_per_s"] for t in trials),
            "on_steps_per_s": median(on["steps_per_s"] for on in ons),
            "ratio": {"median": median(ratios), "min": min(ratios), "max": max(ratios)},
            "every": median(on["stats"]["every"] for on in ons),
            "copy_ms": median(on["stats"]["copy_s"] for on in ons) * 1e3,
            "cadence_step_ms": median(on["stats"]["step_s"] for on in ons) * 1e3,
            "commit_ms": median(steady) * 1e3 if steady else None,
            "first_commit_ms": median(on["commit_call_s"][0] for on in ons) * 1e3,
            "taken_measured": median(on["taken_measured"] for on in ons),
            "written": median(on["stats"]["commits"] for on in ons),
            "skipped": median(on["stats"]["skipped"] for on in ons),
            "flush_ms": median(on["flush_s"] for on in ons) * 1e3}


def cost_rows(costs: dict[str, dict[str, Any]], all_sizes: list[Size]) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for size in all_sizes:
        s = costs[f"{size.params:g}"]["summary"]
        ratio = s["ratio"]
        spread = "" if ratio["min"] == ratio["max"] else \
            f"{ratio['min']:.2f}-{ratio['max']:.2f}"
        rows.append([f"{s['params'] / 1e6:.1f}M", s["off_steps_per_s"], s["on_steps_per_s"],
                     f"{ratio['median']:.3f}", spread, f"{s['every']:g}", s["copy_ms"],
                     "-" if s["commit_ms"] is None else s["commit_ms"], s["first_commit_ms"],
                     f"{s['taken_measured']:g} / {size.steps}",
                     f"{s['written']:g}", f"{s['skipped']:g}", 1e3 / s["off_steps_per_s"],
                     s["cadence_step_ms"], s["flush_ms"]])
    return rows


def print_costs(costs: dict[str, dict[str, Any]], all_sizes: list[Size], trials: int) -> None:
    print_table(f"flash: cost of FlashCommits.commit(step) at every step's end, one process, "
                f"MLP + AdamW, batch 32; steps/s median of {trials} (on/off: the median of "
                "each trial's ratio, min-max)",
                ["params", "off steps/s", "on steps/s", "on/off", "min-max", "every",
                 "copy ms", "commit ms", "first ms", "taken", "written", "skipped",
                 "off step ms", "cadence step ms", "flush ms"],
                cost_rows(costs, all_sizes))
    print("  every: the cadence in force at the end (stats().every); copy ms: the cadence's "
          "recent median of the copy (stats().copy_s); commit ms: the median commit() call "
          "that took a commit, the first (the buffers allocation) left out (-: no other); "
          "first ms: the first such call; taken: commits taken / measured steps; written, "
          "skipped: stats().commits, .skipped (warm-up included); cadence step ms: "
          "stats().step_s against the off runs' measured step; flush ms: the writer's final "
          "flush, outside the steps/s")
