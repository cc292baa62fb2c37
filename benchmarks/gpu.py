"""GPU: in-process recovery over NCCL, throughput against DDP over NCCL, and where commits of
GPU state are best kept. Run it on a machine with a GPU: `python benchmarks/run.py gpu`.

All workers share this machine's GPU (cuda:0). NCCL refuses two ranks of one communicator
on one GPU of one host, so each worker gets its own NCCL host identity (NCCL_HOSTID), and
NCCL connects them with its socket transport over loopback; on a real cluster (a GPU per
rank, NVLink or InfiniBand) communication is faster than here, while detection, abort,
rendezvous and communicator init are the same steps.

recovery     4 workers (2 hosts x 2 on loopback), ~10M parameters, --backend nccl, one
             SIGKILLed between two commits: kill -> first completed step after, with
             recovery.py's breakdown (detection, decision, rendezvous, groups: Gloo and the
             NCCL communicator, sync, first step) and the survivors' abort and teardown.
throughput   2 workers, overhead.py's MLPs of 1M and 10M parameters: elasticrun
             (DistributedOptimizer, commit every 10 steps) against DDP over NCCL under
             torchrun, interleaved in the same run.
commit       one process: TorchState.commit() and restore() of a model and its Adam state
             with commits kept on the device or in pinned host memory.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import print_table, summarize

PHASES = ("detection_s", "decision_s", "rendezvous_s", "gloo_s", "sync_s", "first_step_s")
GPU_ARGS = ["--backend", "nccl"]
GPU_ENV = {"BENCH_DEVICE": "cuda", "BENCH_NCCL_HOST_PER_WORKER": "1",
           "ELASTICRUN_CUDA_DEVICE": "0", "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1"}


def _cuda_or_skip() -> str | None:
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        return "no CUDA device (this benchmark runs on a GPU machine)"
    if not dist.is_nccl_available():
        return "torch was built without NCCL"
    return None


def recovery(trials: int, quick: bool) -> dict[str, Any]:
    from recovery import COMMIT_EVERY, elasticrun_trial

    params, steps = (1e5, 2 * COMMIT_EVERY) if quick else (1e7, 4 * COMMIT_EVERY)
    runs = []
    for _ in range(trials):
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(elasticrun_trial(params, steps, Path(tmp), GPU_ARGS, GPU_ENV))
    median = summarize(runs)
    print_table(f"GPU recovery: 4 workers on one GPU over NCCL, ~{median['params'] / 1e6:.1f}M "
                f"parameters, one SIGKILLed; median of {trials}",
                ["resume s", "caught up s", "steps lost", "survivor abort+teardown s"],
                [[median["resume_s"], median["caught_up_s"], median["steps_lost"],
                  median["teardown_s"]]])
    print_table("  resume, broken down (s; gloo_s: the Gloo group and the NCCL communicator)",
                PHASES, [[median[k] for k in PHASES]])
    return {"median": median, "trials": runs}


def throughput(trials: int, quick: bool) -> dict[str, Any]:
    import overhead

    sizes = {1e5: 21} if quick else {1e6: 501, 1e7: 101}
    env = {**GPU_ENV, "ELASTICRUN_BACKEND": GPU_ARGS[1]}
    results: dict[str, Any] = {}
    rows = []
    for params, steps in sizes.items():
        runs: dict[str, list[dict[str, float]]] = {"ddp": [], "commit_10": []}
        for _ in range(trials):  # interleaved, so that drift of the machine hits both
            for config in runs:
                runs[config].append(overhead.run_config(config, params, steps, env))
        rate = {c: statistics.median(r["steps_per_s"] for r in runs[c]) for c in runs}
        results[f"{params:g}"] = {"steps_per_s": rate, "trials": runs}
        rows.append([f"{params / 1e6:g}M", rate["ddp"], rate["commit_10"],
                     f"{rate['commit_10'] / rate['ddp']:.2f}x"])
    print_table(f"GPU throughput: 2 workers on one GPU, MLP, steps/s (median of {trials})",
                ["parameters", "DDP (NCCL)", "elasticrun, commit every 10", "ratio"], rows)
    return results


def commit(trials: int, quick: bool) -> dict[str, Any]:
    import torch

    from elasticrun.torch.elastic.state import TorchState

    width = 1024 if quick else 4096
    layers = 2 if quick else 6
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(8, width, device="cuda")).sum().backward()
    optimizer.step()
    params = sum(p.numel() for p in model.parameters())
    results: dict[str, Any] = {}
    rows = []
    for place in ("device", "host"):
        state = TorchState(model, optimizer, commit_to=place)
        commits, restores = [], []
        for _ in range(max(3, trials * 3)):
            torch.cuda.synchronize()
            started = time.perf_counter()
            state.save()  # what commit() copies (commit() also checks for host changes)
            launched = time.perf_counter()
            torch.cuda.synchronize()
            commits.append((launched - started, time.perf_counter() - started))
            started = time.perf_counter()
            state.restore()
            torch.cuda.synchronize()
            restores.append(time.perf_counter() - started)
        results[place] = {
            "commit_cpu_ms": statistics.median(c[0] for c in commits) * 1e3,
            "commit_done_ms": statistics.median(c[1] for c in commits) * 1e3,
            "restore_ms": statistics.median(restores) * 1e3}
        rows.append([place, *results[place].values()])
    print_table(f"GPU commit placement: {params / 1e6:.0f}M parameters + Adam state",
                ["commit_to", "commit (CPU busy) ms", "commit (copies done) ms", "restore ms"],
                rows)
    return {"params": params, **results}


def bench(trials: int, quick: bool) -> dict[str, Any]:
    reason = _cuda_or_skip()
    if reason is not None:
        print(f"gpu: skipped: {reason}")
        return {"skipped": reason}
    import torch

    device = torch.cuda.get_device_name(0)
    print(f"gpu: {device}, torch {torch.__version__}, NCCL "
          f"{'.'.join(map(str, torch.cuda.nccl.version()))}")
    return {"device": device, "commit": commit(trials, quick),
            "recovery": recovery(trials, quick), "throughput": throughput(trials, quick)}
