"""Elastic HSDP (issue 57): recovery, a returning group's state transfer, the commit's cost
and step time, each against its peer measured in the same invocation.

`python benchmarks/hsdp.py [--trials N] [--quick] [--parts a,b,c,d,e] [--json PATH]` prints
its tables and writes every trial to PATH (default results/hsdp.json, results/hsdp-quick.json
with --quick). The model is scripts/hsdp_model.py's transformer LM (synthetic tokens, batch
8 x 32 tokens per rank, AdamW, OMP_NUM_THREADS=1, Gloo on loopback); 127.0.0.x are hosts of
this machine.

a. recovery: 4 workers, `-H 127.0.0.1:2,127.0.0.2:2 --min-np 2`, ~4M parameters, rank 3 (on
   the second host) SIGKILLs itself at the start of step KILL_STEP (commits every
   COMMIT_EVERY): kill -> the survivors' first completed step (in the new round), elastic
   HSDP (`--shard-size 2`: FSDP2 on er.shard_mesh(), er.replicate, a plain AdamW) against
   today's data-parallel path (er.DistributedOptimizer over AdamW, the whole model on every
   rank); with the driver's detection (kill -> worker_failed) and decision (-> the new
   round). Median of N trials, modes alternated.
b. a returning group's state transfer: the same kill with `--blacklist-cooldown-range 1 2`;
   the survivors train 2 steps and wait; the host comes back and its new workers receive
   their shards (model and AdamW state) from the live groups in `state.sync()`, timed in the
   worker (scripts/er_hsdp_train.py's TorchState subclass). ~1M, ~4M, ~16M parameters; 2
   groups (one live group is the only source) and 3 groups of 2 (-np 6: the joining group's
   shard i comes from live group i mod 2, striped). "join s" is the slowest joiner's sync
   (its shard's bytes / that = MiB/s); "live s" the survivors' (from their reset: it holds
   the joiners' model build too).
c. the commit's cost: in the same jobs, before the kill, `state.commit()` every step and the
   copy it makes (`save()`), medians over every rank's commits, per MiB of the rank's local
   shard (model and optimizer state).
d. step time: elastic HSDP (`-np 4 -H 127.0.0.1:2,127.0.0.2:2 --shard-size 2`, a commit
   every 10 steps) against torch's own HSDP without elasticity (`torch.distributed.run
   --standalone --nproc-per-node 4` running scripts/hsdp_native.py: a (replicate, shard)
   = (2, 2) DeviceMesh of Gloo groups, fully_shard on it), the same model and batches; rank
   0's steps/s after WARMUP_STEPS (median over windows of 10 steps), trials alternated A/B
   and B/A; the ratio is the median of each trial's own (target >= 0.95).
e. torchft 0.2.0 (hsdp_torchft.py, from PyPI into the side venv benchmarks/.venv-torchft):
   its HSDP on CPU (FSDP2 in each group, the Manager's allreduce in FSDP's all-reduce hook),
   the kill of (a); the Lighthouse's heartbeat timeout at its default 5 s and at 1 s. If
   torchft cannot be installed, the table says why and this part is skipped.
--quick: ~0.1M parameters, one trial, 2 groups only, no torchft.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import RESULTS, median, print_table, read_events, summarize  # noqa: E402
from hsdp_jobs import SHARD, hosts, run_elasticrun, run_native  # noqa: E402

COMMIT_EVERY = 5  # a: the kill comes 3 steps after a commit
KILL_STEP = 8
STEPS_AFTER_KILL = 5
REJOIN_KILL_STEP = 6  # b, c: a commit every step before it
WARMUP_STEPS = 5  # d
WINDOW = 10
TARGET = 0.95
MODES = ("hsdp", "ddp")
REJOIN_SIZES = ("1M", "4M", "16M")
REJOIN_TRIALS = 1  # b, c: one job per size and group count (each joiner's sync, every commit)
MIB = 2**20


def _first(events: list[dict[str, Any]], kind: str, after: float) -> dict[str, Any]:
    return next(e for e in events if e["event"] == kind and e["time"] > after)


# --- a. recovery ----------------------------------------------------------------------------
def recovery_trial(mode: str, size: str, tmp: Path) -> dict[str, Any]:
    out, driver_log = tmp / "events.jsonl", tmp / "driver.jsonl"
    flags = ["-np", str(2 * SHARD), "--min-np", str(SHARD), "-H", hosts(2),
             "--event-log", str(driver_log), *(["--shard-size", str(SHARD)]
                                               if mode == "hsdp" else [])]
    run_elasticrun(flags, {"BENCH_MODE": mode, "BENCH_SIZE": size,
                           "BENCH_COMMIT_EVERY": str(COMMIT_EVERY),
                           "BENCH_KILL_STEP": str(KILL_STEP),
                           "BENCH_KILL_RANK": str(2 * SHARD - 1),
                           "BENCH_STEPS": str(KILL_STEP + STEPS_AFTER_KILL)}, out,
                   f"{mode} recovery job")
    events = read_events(out)
    driver = [{**e, "event": e["type"]} for e in read_events(driver_log)]
    kill = _first(events, "kill", 0)
    t = kill["time"]
    resumed = next(e for e in events if e["event"] == "step" and e["round"] > 1)
    failed = _first(driver, "worker_failed", t)["time"]
    opened = _first(driver, "round_started", failed)["time"]
    before = [e["time"] for e in events if e["event"] == "step" and e["rank"] == 0
              and e["round"] == 1 and 2 <= e["step"] <= KILL_STEP]
    steady = median(b - a for a, b in itertools.pairwise(before))
    return {"resume_s": resumed["time"] - t, "detection_s": failed - t,
            "decision_s": opened - failed, "after_round_s": resumed["time"] - opened,
            "steady_step_s": steady, "size_after": resumed["size"],
            "steps_lost": kill["step"] - (resumed["step"] - 1),
            "params": _first(events, "done", 0)["params"]}


def recovery(size: str, trials: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for trial in range(trials):  # alternated, so that drift of the machine hits both
        for mode in MODES if trial % 2 == 0 else MODES[::-1]:
            with tempfile.TemporaryDirectory() as tmp:
                runs[mode].append(recovery_trial(mode, size, Path(tmp)))
    medians = {mode: summarize(r) for mode, r in runs.items()}
    hsdp = medians["hsdp"]
    rows = []
    for mode, label in (("hsdp", "elastic HSDP 2x2"), ("ddp", "DDP path, -np 4")):
        m = medians[mode]
        ratio = "" if mode == "hsdp" else f"{m['resume_s'] / hsdp['resume_s']:.2f}x"
        rows.append([label, m["resume_s"], ratio, m["detection_s"], m["decision_s"],
                     m["after_round_s"], m["steady_step_s"], m["steps_lost"]])
    print_table(f"a. recovery: 4 workers on 2 hosts, ~{hsdp['params'] / 1e6:.1f}M parameters, "
                f"rank 3 SIGKILLed at step {KILL_STEP} (commit every {COMMIT_EVERY}), --min-np "
                f"2; kill -> the survivors' first step; median of {trials}",
                ["", "resume s", "vs HSDP", "detection s", "decision s", "round -> step s",
                 "step s before", "steps lost"], rows)
    return {"size": size, "median": medians, "trials": runs}


# --- b, c. a returning group's sync; the commit's cost ---------------------------------------
def rejoin_trial(size: str, groups: int, tmp: Path) -> dict[str, Any]:
    out = tmp / "events.jsonl"
    world = groups * SHARD
    flags = ["-np", str(world), "--min-np", str(world - SHARD), "-H", hosts(groups),
             "--shard-size", str(SHARD), "--blacklist-cooldown-range", "1", "2"]
    run_elasticrun(flags, {"BENCH_MODE": "hsdp", "BENCH_SIZE": size, "BENCH_COMMIT_EVERY": "1",
                           "BENCH_KILL_STEP": str(REJOIN_KILL_STEP),
                           "BENCH_KILL_RANK": str(world - 1),
                           "BENCH_AWAIT_SIZE": str(world), "BENCH_STEPS": "1000",
                           "BENCH_STEPS_AFTER": "2"}, out, f"{size} rejoin job, {groups} groups")
    events = read_events(out)
    original = {e["pid"] for e in events if e["event"] == "synced" and e["round"] == 1}
    back = [e for e in events if e["event"] == "synced" and e["size"] == world and e["round"] > 1]
    joiners = [e for e in back if e["pid"] not in original]
    live = [e for e in back if e["pid"] in original]
    if len(joiners) != SHARD:
        raise RuntimeError(f"expected {SHARD} joining workers, found {len(joiners)}")
    sizes = {e["rank"]: e for e in events if e["event"] == "sizes"}
    shard_bytes = max(s["model_bytes"] + s["optimizer_bytes"] for s in sizes.values())
    commits = [e for e in events if e["event"] == "step" and e["round"] == 1
               and e["commit_s"] > 0 and e["step"] >= 2]  # the first commit allocates
    join_s = max(e["sync_s"] for e in joiners)
    return {"join_s": join_s, "live_s": max(e["sync_s"] for e in live),
            "shard_mib": shard_bytes / MIB, "join_mib_per_s": shard_bytes / MIB / join_s,
            "params": sizes[0]["params"],
            "model_mib": sizes[0]["model_bytes"] / MIB,
            "commit_ms": 1e3 * median(e["commit_s"] for e in commits),
            "save_ms": 1e3 * median(e["save_s"] for e in commits), "commits": len(commits)}


def rejoin(sizes: list[str], group_counts: list[int], trials: int) -> dict[str, Any]:
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        size: {str(g): [] for g in group_counts} for size in sizes}
    for _ in range(trials):
        for size in sizes:
            for groups in group_counts:
                with tempfile.TemporaryDirectory() as tmp:
                    runs[size][str(groups)].append(rejoin_trial(size, groups, Path(tmp)))
    medians = {size: {g: summarize(r) for g, r in by.items()} for size, by in runs.items()}
    rows = []
    for size in sizes:
        for g in map(str, group_counts):
            m = medians[size][g]
            source = "one live group" if g == "2" else f"striped over {int(g) - 1} live groups"
            rows.append([f"~{m['params'] / 1e6:.1f}M", f"{g} x {SHARD}", source,
                         m["shard_mib"], m["join_s"], m["join_mib_per_s"], m["live_s"]])
    print_table(f"b. a returning group's state.sync(): each joiner receives its shard (model + "
                f"AdamW state); median of {trials}",
                ["params", "groups", "source", "shard MiB", "join s", "MiB/s", "live s"], rows)
    rows = []
    for size in sizes:
        for g in map(str, group_counts):
            m = medians[size][g]
            rows.append([f"~{m['params'] / 1e6:.1f}M", f"{g} x {SHARD}", m["shard_mib"],
                         m["commit_ms"], m["commit_ms"] / m["shard_mib"], m["save_ms"],
                         m["save_ms"] / m["shard_mib"]])
    print_table("c. the commit's cost per MiB of local shard (model + AdamW state): every "
                "rank's commits before the kill, one every step; median",
                ["params", "groups", "shard MiB", "commit ms", "ms/MiB", "save ms",
                 "save ms/MiB"], rows)
    print("  save: the copy into the commit's buffers; commit: save and the host-change "
          "agreement, one scalar allreduce over all ranks that waits for the slowest (the DDP "
          "path carries it on the optimizer's allreduce)", flush=True)
    return {"median": medians, "trials": runs}


# --- d. step time -----------------------------------------------------------------------------
def steps_per_s(events: list[dict[str, Any]], measured: int) -> float:
    """Rank 0's steps/s: the median over windows of WINDOW steps after the warm-up."""
    at = {e["step"]: e["time"] for e in events if e["event"] == "step" and e["rank"] == 0}
    edges = range(WARMUP_STEPS, WARMUP_STEPS + measured + 1, WINDOW)
    return median(WINDOW / (at[b] - at[a]) for a, b in itertools.pairwise(edges))


def throughput_trial(kind: str, size: str, measured: int, tmp: Path) -> float:
    out = tmp / "events.jsonl"
    steps = str(WARMUP_STEPS + measured)
    if kind == "elastic":
        run_elasticrun(["-np", str(2 * SHARD), "-H", hosts(2), "--shard-size", str(SHARD)],
                       {"BENCH_MODE": "hsdp", "BENCH_SIZE": size, "BENCH_STEPS": steps,
                        "BENCH_COMMIT_EVERY": str(WINDOW)}, out, "elastic HSDP job")
    else:
        run_native({"BENCH_SIZE": size, "BENCH_STEPS": steps, "BENCH_SHARD_SIZE": str(SHARD)},
                   out, "torchrun HSDP job")
    return steps_per_s(read_events(out), measured)


def throughput(size: str, measured: int, trials: int) -> dict[str, Any]:
    kinds = ("elastic", "native")
    runs: dict[str, list[float]] = {kind: [] for kind in kinds}
    for trial in range(trials):  # A/B, then B/A
        for kind in kinds if trial % 2 == 0 else kinds[::-1]:
            with tempfile.TemporaryDirectory() as tmp:
                runs[kind].append(throughput_trial(kind, size, measured, Path(tmp)))
    ratios = [e / n for e, n in zip(runs["elastic"], runs["native"], strict=True)]
    result = {"size": size, "steps_per_s": {k: median(v) for k, v in runs.items()},
              "ratio": median(ratios), "ratio_range": [min(ratios), max(ratios)],
              "trials": runs}
    print_table(f"d. step time, 4 workers, {size} parameters, rank 0's steps/s over {measured} "
                f"steps after {WARMUP_STEPS}; median of {trials} (A/B alternated); ratio: "
                f"median of each trial's own (target >= {TARGET})",
                ["", "steps/s", "step ms", "elastic / native", "range"],
                [["elastic HSDP (elasticrun, commit every 10)", result["steps_per_s"]["elastic"],
                  1e3 / result["steps_per_s"]["elastic"], f"{result['ratio']:.3f}",
                  f"{min(ratios):.3f}-{max(ratios):.3f}"],
                 ["torch HSDP (torchrun, 2-D mesh)", result["steps_per_s"]["native"],
                  1e3 / result["steps_per_s"]["native"], "", ""]])
    return result


# --- all --------------------------------------------------------------------------------------
PARTS = ("a", "b", "c", "d", "e")


def bench(trials: int, quick: bool, parts: tuple[str, ...] = PARTS) -> dict[str, Any]:
    trials = 1 if quick else trials
    size = "0.1M" if quick else "4M"
    result: dict[str, Any] = {"trials": trials, "quick": quick, "wall_s": {}}

    def timed(name: str, part: Callable[[], dict[str, Any]]) -> None:
        started = time.monotonic()
        result[name] = part()
        result["wall_s"][name] = time.monotonic() - started
        print(f"  ({name}: {result['wall_s'][name]:.0f} s)", flush=True)

    if "a" in parts:
        timed("a_recovery", lambda: recovery(size, trials))
    if "b" in parts or "c" in parts:
        timed("bc_rejoin", lambda: rejoin(["0.1M"] if quick else list(REJOIN_SIZES),
                                          [2] if quick else [2, 3], REJOIN_TRIALS))
    if "d" in parts:
        timed("d_throughput", lambda: throughput(size, WINDOW if quick else 3 * WINDOW,
                                                 trials))
    if "e" in parts:
        from hsdp_torchft import torchft_recovery

        timed("e_torchft", lambda: torchft_recovery(size, KILL_STEP, trials, quick,
                                                    result.get("a_recovery")))
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="~0.1M parameters, one trial")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated, of {', '.join(PARTS)} [default: all]")
    parser.add_argument("--json", type=Path, default=None,
                        help="where to write the results [default: results/hsdp.json]")
    args = parser.parse_args(argv)
    parts = tuple(part for part in args.parts.split(",") if part)
    unknown = [part for part in parts if part not in PARTS]
    if unknown:
        parser.error(f"unknown part {unknown[0]!r}; expected some of {', '.join(PARTS)}")
    result = bench(args.trials, args.quick, parts)
    path = args.json or RESULTS / f"hsdp{'-quick' if args.quick else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
