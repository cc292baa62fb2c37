"""DistributedOptimizer: training throughput with and without gradient hooks, against DDP,
and what fp16 compression saves.

2 workers on this machine, three models: a 6-layer transformer encoder (d_model 256,
synthetic token batches), a 12-layer conv net with BatchNorm (synthetic 32x32 images) and
overhead's 1M-parameter MLP. Per trial, one elasticrun job (scripts/optimizer_worker.py)
trains each model in four variants, each on its own copy of the model, taking turns of a
few steps (so that load from outside this benchmark hits all alike): "hooks" (overlap=True:
each bucket's allreduce starts from the gradient hooks while backward runs), "no hooks"
(overlap=False: every allreduce starts at step()) and "fp16" (hooks, and
Compression.fp16), each committing a TorchState every 10 steps as an elastic script does,
"every step" (hooks, committing every step, host snapshots on as by default),
and "DDP here" (plain DDP on the same job's Gloo group, no commits); then one torchrun job
trains as many copies of each model with plain DDP (Gloo), taking turns the same way, so
that both jobs hold the same memory and switch between models alike (a torchrun job with
one copy runs ~3% faster on this machine than the same DDP among four copies: caches). Throughput is
samples per second of both workers, from the median step after a warm-up (a median, since
this 2-core machine's hiccups move a mean a lot); the tables show the median over trials.
Bytes on the wire are the gradient bytes the allreduces of one step carry (counted from each
reduced buffer's dtype and element count; the small int64 headers elasticrun sends before
each allreduce are not gradients, and are counted apart).
"""

from __future__ import annotations

import json
import os
import resource
import tempfile
import time
from collections.abc import Sequence
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

WORKER = SCRIPTS / "optimizer_worker.py"
ER_VARIANTS = ("hooks", "nohooks", "fp16", "ddp_here", "every_step")
VARIANTS = ("ddp", *ER_VARIANTS)
LABELS = {"ddp": "DDP", "hooks": "hooks", "nohooks": "no hooks", "fp16": "hooks+fp16",
          "ddp_here": "DDP here", "every_step": "hooks, commit every step"}
MODELS = {
    "transformer": {"layers": 6, "d_model": 256, "heads": 4, "batch": 8, "seq": 32},
    "convnet": {"widths": [32] * 3 + [64] * 3 + [128] * 3 + [256] * 3, "batch": 16,
                "image": 32},
    "mlp": {"params": 1e6, "in_features": 64, "batch": 32},
}
FULL = {"warmup": 3, "steps": 40, "round_steps": 5, "commit_every": 10, **MODELS}
QUICK = {"warmup": 2, "steps": 6, "round_steps": 2, "commit_every": 10, **MODELS}
Spec = dict[str, Any]


def cpu_seconds() -> tuple[float, float, float]:
    """Now: the wall clock, the CPU seconds this machine has been busy (stolen by the
    hypervisor included), and those of this process's reaped descendants."""
    ticks = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (time.monotonic(), (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK"),
            children.ru_utime + children.ru_stime)


def run_job(spec: Spec, variants: Sequence[str], out: Path) -> list[dict[str, Any]]:
    """One job of 2 workers (torchrun for DDP, elasticrun otherwise): its "measured" events,
    each with the share of the machine's CPU that processes outside the job took meanwhile
    (the machine is shared: that load slows every variant)."""
    env = bench_env({"BENCH_OUT": str(out), "BENCH_SPEC": json.dumps(spec),
                     "BENCH_VARIANTS": ",".join(variants)})
    if set(variants) == {"ddp"}:
        command = torchrun_command(WORKER, 2, port=free_port())
    else:
        command = elasticrun_command(["-np", "2"], WORKER)
    before = cpu_seconds()
    with Jobs() as jobs:
        jobs.start(command, env)
        jobs.wait(600, f"optimizer job ({','.join(variants)})", progress=out, stall_s=120)
    wall, busy, ours = (b - a for a, b in zip(before, cpu_seconds(), strict=True))
    other_load = max(0.0, busy - ours) / (wall * (os.cpu_count() or 1))
    return [{**e, "other_load": other_load} for e in read_events(out) if e["event"] == "measured"]


def trial_numbers(event: dict[str, Any]) -> dict[str, float]:
    """One model and variant in one trial: throughput, step time and its parts, and the
    allreduces of one step."""
    total = event["total_s"]
    payload = [a for a in event["allreduces"] if a["dtype"].startswith(("float", "bfloat"))]
    headers = [a for a in event["allreduces"] if a not in payload]
    return {"samples_per_s": event["world"] * event["batch"] / median(total),
            "step_ms": median(total) * 1e3,
            "backward_ms": median(event["backward_s"]) * 1e3,
            "optimizer_step_ms": median(event["step_s"]) * 1e3,
            "grad_bytes": sum(a["bytes"] for a in payload),
            "allreduces": len(payload), "header_bytes": sum(a["bytes"] for a in headers),
            "params": event["params"], "other_load": event["other_load"]}


def run_trials(spec: Spec, trials: int) -> dict[str, dict[str, list[dict[str, float]]]]:
    """Per model and variant, each trial's numbers."""
    models = [m for m in MODELS if m in spec]
    runs: dict[str, dict[str, list[dict[str, float]]]] = {
        m: {v: [] for v in VARIANTS} for m in models}
    with tempfile.TemporaryDirectory(prefix="elasticrun-optimizer-") as tmp:
        for trial in range(trials):
            events = run_job(spec, ER_VARIANTS, Path(tmp) / f"er-{trial}.jsonl")
            events += run_job(spec, ["ddp"] * len(ER_VARIANTS), Path(tmp) / f"ddp-{trial}.jsonl")
            for event in events:
                runs[event["model"]][event["variant"]].append(trial_numbers(event))
    return runs


def medians(runs: dict[str, dict[str, list[dict[str, float]]]]) -> dict[str, Any]:
    """Per model and variant the median over trials; and hooks against DDP in the same job,
    trial by trial (they took turns, so the machine's drift hits both)."""
    med: dict[str, Any] = {
        model: {variant: {key: median(t[key] for t in trials) for key in trials[0]}
                for variant, trials in by_variant.items()}
        for model, by_variant in runs.items()}
    for model, by_variant in runs.items():
        med[model]["hooks_vs_ddp_here"] = median(
            hooks["samples_per_s"] / here["samples_per_s"]
            for hooks, here in zip(by_variant["hooks"], by_variant["ddp_here"], strict=True))
    return med


def print_tables(med: dict[str, Any], trials: int) -> None:
    rows = []
    for model, m in med.items():
        rate = {v: m[v]["samples_per_s"] for v in VARIANTS}
        rows.append([model, f"{m['hooks']['params'] / 1e6:.2f}M", rate["ddp"],
                     rate["ddp_here"], rate["nohooks"], rate["hooks"],
                     f"{rate['hooks'] / rate['ddp']:.2f}x",
                     f"{m['hooks_vs_ddp_here']:.2f}x", f"{rate['nohooks'] / rate['ddp']:.2f}x",
                     rate["every_step"], f"{rate['every_step'] / rate['ddp']:.2f}x"])
    print_table(f"optimizer: 2 workers, samples/s, median of {trials} (hooks = "
                "DistributedOptimizer(overlap=True), no hooks = overlap=False, both "
                "committing every 10 steps; DDP under torchrun, and DDP here: in the same job, "
                "taking turns with hooks)",
                ["model", "params", "DDP", "DDP here", "no hooks", "hooks", "hooks/DDP",
                 "hooks/DDP here", "no hooks/DDP", "every step", "every step/DDP"], rows)
    first = next(iter(med.values()))
    print(f"  (other processes took {first['hooks']['other_load']:.0%} of this machine's CPU "
          f"during the elasticrun jobs, {first['ddp']['other_load']:.0%} during the torchrun "
          "jobs: median)")
    print_table("optimizer: a step's median milliseconds, zero_grad+forward+backward and "
                "step()",
                ["model", "variant", "fwd+bwd", "step()", "total"],
                [[model, LABELS[v], m[v]["backward_ms"], m[v]["optimizer_step_ms"],
                  m[v]["step_ms"]] for model, m in med.items() for v in VARIANTS])
    rows = []
    for model, m in med.items():
        none, fp16 = m["hooks"], m["fp16"]
        rows.append([model, none["allreduces"], fp16["allreduces"],
                     none["grad_bytes"] / 2**20, fp16["grad_bytes"] / 2**20,
                     f"{fp16['grad_bytes'] / none['grad_bytes']:.2f}x", none["step_ms"],
                     fp16["step_ms"], f"{fp16['step_ms'] / none['step_ms']:.2f}x"])
    print_table("optimizer: Compression.none vs fp16 (hooks on): allreduces and gradient MiB "
                "per step, step ms",
                ["model", "allreduces", "fp16", "MiB/step", "fp16", "fp16/none",
                 "step ms", "fp16", "fp16/none"], rows)


def run(spec: Spec, trials: int) -> dict[str, Any]:
    runs = run_trials(spec, trials)
    med = medians(runs)
    print_tables(med, trials)
    return {"spec": spec, "trials": runs, "median": med}


def bench(trials: int, quick: bool) -> dict[str, Any]:
    return run(QUICK if quick else FULL, trials)
