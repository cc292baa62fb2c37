"""What both training scripts share: the model, the batch, the timestamped event log and
the settings.

Env: BENCH_PARAMS (approximate parameter count), BENCH_OUT (JSON-lines file of events),
BENCH_STEPS (stop after this step), BENCH_KILL_STEP / BENCH_KILL_RANK (that rank SIGKILLs
itself at that step, once), BENCH_TARGET_SIZE / BENCH_STEPS_AT_TARGET (scale-up: stop
after that many steps at that world size), BENCH_DEVICE (cpu, or cuda: every worker on
the current GPU), BENCH_NCCL_HOST_PER_WORKER=1 (each worker its own NCCL host identity, so
that several ranks can share one GPU over NCCL's sockets), BENCH_PROFILE (rank 0 writes
torch profiler's tables of steps PROFILE_STEPS to this file, and their trace, for
chrome://tracing or Perfetto, beside it with ".trace.json" added), BENCH_DEVICE_S (see
device_time; default 0), BENCH_SLOW_DIR (device_time: a file slow-<host>-<local rank>
there makes that slot's device time that many times longer: a throttled GPU).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import torch

PARAMS = int(float(os.environ.get("BENCH_PARAMS", "1e6")))
OUT = os.environ.get("BENCH_OUT", "/dev/null")
STEPS = int(os.environ.get("BENCH_STEPS", "60"))
KILL_STEP = int(os.environ.get("BENCH_KILL_STEP", "-1"))
KILL_RANK = int(os.environ.get("BENCH_KILL_RANK", "-1"))
TARGET_SIZE = int(os.environ.get("BENCH_TARGET_SIZE", "0"))
STEPS_AT_TARGET = int(os.environ.get("BENCH_STEPS_AT_TARGET", "5"))
DEVICE = torch.device(os.environ.get("BENCH_DEVICE", "cpu"))
if os.environ.get("BENCH_NCCL_HOST_PER_WORKER") == "1":
    os.environ["NCCL_HOSTID"] = f"elasticrun-bench-{os.getpid()}"
DEVICE_S = float(os.environ.get("BENCH_DEVICE_S", "0"))
SLOW_DIR = os.environ.get("BENCH_SLOW_DIR", "")
PROFILE = os.environ.get("BENCH_PROFILE", "")
PROFILE_STEPS = (30, 50)
BATCH = 32
IN_FEATURES = 64
CLASSES = 10


def emit(event: str, **fields: object) -> None:
    with open(OUT, "a") as file:
        file.write(json.dumps({"event": event, "time": time.time(), "pid": os.getpid(),
                               "host": os.environ.get("ELASTICRUN_HOSTNAME", ""),
                               **fields}) + "\n")


def build_model() -> torch.nn.Module:
    """An MLP whose one width x width layer holds nearly all of PARAMS parameters."""
    torch.manual_seed(0)
    width = max(8, int(math.sqrt(PARAMS)))
    return torch.nn.Sequential(torch.nn.Linear(IN_FEATURES, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, CLASSES)).to(DEVICE)


def device_time() -> None:
    """An accelerator's share of one step, as DEVICE_S seconds asleep: with more workers than
    cores, a step's time then depends on the world size as it does where each worker has a
    device of its own, not on how many processes share the cores."""
    if DEVICE_S:
        time.sleep(DEVICE_S * slowness())


def slowness() -> float:
    """How many times slower this worker's slot is (SLOW_DIR/slow-<host>-<local rank>):
    the slot's, not the process's, as a throttled GPU stays so for whichever worker uses
    it."""
    if not SLOW_DIR:
        return 1.0
    host = os.environ.get("ELASTICRUN_HOSTNAME") or os.environ.get("BENCH_HOST", "")
    try:
        return float(Path(SLOW_DIR, f"slow-{host}-{os.environ.get('LOCAL_RANK', '0')}")
                     .read_text())
    except (OSError, ValueError):
        return 1.0


def batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(rank)
    return (torch.randn(BATCH, IN_FEATURES, generator=generator).to(DEVICE),
            torch.randint(0, CLASSES, (BATCH,), generator=generator).to(DEVICE))


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class StepProfile:
    """torch profiler over PROFILE_STEPS on rank 0 when BENCH_PROFILE names a file: its tables
    by device time and by CPU time (with CUDA, kernels and the host calls that wait)."""

    def __init__(self, rank: int) -> None:
        self.active = bool(PROFILE) and rank == 0
        self.profiler: torch.profiler.profile | None = None

    def at(self, step: int) -> None:
        if not self.active:
            return
        if step == PROFILE_STEPS[0] and self.profiler is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if DEVICE.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profiler = torch.profiler.profile(activities=activities)
            self.profiler.start()
        elif step == PROFILE_STEPS[1] and self.profiler is not None:
            if DEVICE.type == "cuda":
                torch.cuda.synchronize()
            self.profiler.stop()
            table = self.profiler.key_averages()
            steps = PROFILE_STEPS[1] - PROFILE_STEPS[0]
            with open(PROFILE, "w") as file:
                file.write(f"{steps} steps\n")
                if DEVICE.type == "cuda":
                    file.write(table.table(sort_by="cuda_time_total", row_limit=30) + "\n")
                file.write(table.table(sort_by="self_cpu_time_total", row_limit=30) + "\n")
            self.profiler.export_chrome_trace(PROFILE + ".trace.json")
            self.active = False
