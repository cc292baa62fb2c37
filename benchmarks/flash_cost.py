"""The flash benchmark's cost part (benchmarks/flash.py), in a process of its own: a plain
training loop (an MLP, AdamW, a fixed batch) run with `FlashCommits.commit(step)` at the
end of every step ("on") and without it ("off"), one after the other, every other trial
in the other order, at each size given; prints one JSON line of what it measured.

    OMP_NUM_THREADS=1 python benchmarks/flash_cost.py --params 1e6 1e7 --warmup 20 10 \
        --steps 400 60 --trials 3 --directory /dev/shm/DIR

Each "on" run keeps its commits in a directory of its own under --directory (as
ELASTICRUN_SNAPSHOT_DIR, which elasticrun's launcher gives its workers; the commits go to
its flash/ subdirectory), with a new model, optimizer and FlashCommits (its writer thread
closed and its files removed at the run's end); each "off" run has a new model and
optimizer and no FlashCommits at all. Measured over the --steps steps after the --warmup
ones: steps per second (the writer's final flush is not in it: it is timed apart), and, in
"on" runs, every commit() call that took a commit (its duration on the training thread;
warm-up steps included, so the first, which allocates the buffers, is the first entry), the
commits taken in the measured steps, and FlashCommits.stats() after the flush (commits
written and put off, the cadence in force, the cadence's recent medians of the copy and
of the step).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

SNAPSHOT_DIR = "ELASTICRUN_SNAPSHOT_DIR"  # elasticrun.protocol.ENV_SNAPSHOT_DIR
IN_FEATURES = 64
CLASSES = 10
BATCH = 32


@dataclass
class Measured:
    flash: bool
    steps: int
    elapsed_s: float = 0.0
    steps_per_s: float = 0.0
    commit_steps: list[int] = field(default_factory=list)  # "on": each commit taken
    commit_call_s: list[float] = field(default_factory=list)  # and its commit() call
    taken_measured: int = 0  # commits taken in the measured steps
    stats: dict[str, Any] | None = None  # FlashCommits.stats() after the flush
    flush_s: float = 0.0


def build(params: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """An MLP whose width x width layer holds nearly all of `params` parameters."""
    torch.manual_seed(0)
    width = max(8, int(math.sqrt(params)))
    model = torch.nn.Sequential(torch.nn.Linear(IN_FEATURES, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, CLASSES))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def parameter_count(params: float) -> int:
    return sum(p.numel() for p in build(params)[0].parameters())


def run(params: float, warmup: int, steps: int, directory: Path | None) -> Measured:
    """One run; `directory`: flash commits on, kept there (None: off)."""
    model, optimizer = build(params)
    flash = None
    if directory is not None:
        from elasticrun.flash import FlashCommits

        os.environ[SNAPSHOT_DIR] = str(directory)
        flash = FlashCommits(model=model, optimizer=optimizer)
        if not flash.enabled:
            raise RuntimeError(f"FlashCommits not enabled with {SNAPSHOT_DIR}={directory}")
    generator = torch.Generator().manual_seed(0)
    data = torch.randn(BATCH, IN_FEATURES, generator=generator)
    target = torch.randint(0, CLASSES, (BATCH,), generator=generator)
    result = Measured(flash is not None, steps)
    started = time.perf_counter()
    for step in range(1, warmup + steps + 1):
        if step == warmup + 1:
            started = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()
        if flash is not None:
            called = time.perf_counter()
            if flash.commit(step):
                result.commit_call_s.append(time.perf_counter() - called)
                result.commit_steps.append(step)
                result.taken_measured += step > warmup
    result.elapsed_s = time.perf_counter() - started
    result.steps_per_s = steps / result.elapsed_s
    if flash is not None:
        flushed = time.perf_counter()
        if not flash.flush(300):
            raise RuntimeError("the flash commits were not written within 300 s")
        result.flush_s = time.perf_counter() - flushed
        stats = flash.stats()
        result.stats = None if stats is None else asdict(stats)
        flash.session.close()
    return result


def trials(params: float, count: int, warmup: int, steps: int,
           directory: Path) -> list[dict[str, Any]]:
    """`count` trials of an "off" and an "on" run, every other one "on" first."""
    found: list[dict[str, Any]] = []
    for trial in range(count):
        pair: dict[str, Any] = {}
        for mode in ("off", "on") if trial % 2 == 0 else ("on", "off"):
            where = directory / f"trial{trial}" if mode == "on" else None
            try:
                pair[mode] = asdict(run(params, warmup, steps, where))
            finally:
                if where is not None:
                    shutil.rmtree(where, ignore_errors=True)
        found.append(pair)
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=float, nargs="+", required=True)
    parser.add_argument("--warmup", type=int, nargs="+", required=True,
                        help="warm-up steps, one per --params")
    parser.add_argument("--steps", type=int, nargs="+", required=True,
                        help="measured steps, one per --params")
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--directory", type=Path, required=True,
                        help="where the flash commits go (under /dev/shm, as elasticrun's)")
    args = parser.parse_args(argv)
    if not len(args.params) == len(args.warmup) == len(args.steps):
        parser.error("--params, --warmup and --steps take as many values each")
    sizes = [{"params": parameter_count(params), "warmup": warmup, "steps": steps,
              "trials": trials(params, args.trials, warmup, steps, args.directory)}
             for params, warmup, steps in zip(args.params, args.warmup, args.steps,
                                              strict=True)]
    sys.stdout.write(json.dumps({"batch": BATCH, "sizes": sizes}) + "\n")


if __name__ == "__main__":
    main()
