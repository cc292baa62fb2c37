"""What the MLP training scripts share: the model, its batch and training step, its
optimizers and the settings (kit.py has what every script shares).

Env: BENCH_PARAMS (approximate parameter count), BENCH_STEPS (stop after this step),
BENCH_TARGET_SIZE / BENCH_STEPS_AT_TARGET (scale-up: stop after that many steps at that world
size), BENCH_DEVICE (cpu, or cuda: every worker on the current GPU),
BENCH_NCCL_HOST_PER_WORKER=1 (each worker its own NCCL host identity, so that several ranks
can share one GPU over NCCL's sockets), BENCH_PROFILE (rank 0 writes torch profiler's tables
of steps PROFILE_STEPS to this file, and their trace, for chrome://tracing or Perfetto,
beside it with ".trace.json" added), BENCH_DEVICE_S (see device_time; default 0),
BENCH_SLOW_DIR (device_time: a file slow-<host>-<local rank> there makes that slot's device
time that many times longer: a throttled GPU).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import torch
import torch.nn.functional as F
from kit import env_float, env_int, env_str, host

if TYPE_CHECKING:
    from elasticrun.torch.elastic import TorchState

StateT = TypeVar("StateT", bound="TorchState")

PARAMS = int(env_float("BENCH_PARAMS", 1e6))
STEPS = env_int("BENCH_STEPS", 60)
TARGET_SIZE = env_int("BENCH_TARGET_SIZE", 0)
STEPS_AT_TARGET = env_int("BENCH_STEPS_AT_TARGET", 5)
DEVICE = torch.device(env_str("BENCH_DEVICE", "cpu"))
if os.environ.get("BENCH_NCCL_HOST_PER_WORKER") == "1":
    os.environ["NCCL_HOSTID"] = f"elasticrun-bench-{os.getpid()}"
DEVICE_S = env_float("BENCH_DEVICE_S", 0.0)
SLOW_DIR = env_str("BENCH_SLOW_DIR", "")
PROFILE = env_str("BENCH_PROFILE", "")
PROFILE_STEPS = (30, 50)
BATCH = 32
IN_FEATURES = 64
CLASSES = 10


def mlp(params: float, in_features: int = IN_FEATURES) -> torch.nn.Module:
    """An MLP whose one width x width layer holds nearly all of `params` parameters."""
    width = max(8, int(math.sqrt(params)))
    return torch.nn.Sequential(torch.nn.Linear(in_features, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, CLASSES))


def build_model() -> torch.nn.Module:
    """The MLP of PARAMS parameters on DEVICE, the same on every rank."""
    torch.manual_seed(0)
    return mlp(PARAMS).to(DEVICE)


def distributed_sgd(model: torch.nn.Module, momentum: float = 0.0) -> torch.optim.Optimizer:
    """The scripts' SGD through elasticrun's DistributedOptimizer."""
    import elasticrun.torch as er

    return er.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01,
                                                   momentum=momentum),
                                   named_parameters=model.named_parameters())


def elastic_setup(state_type: type[StateT], momentum: float = 0.0
                  ) -> tuple[torch.nn.Module, torch.optim.Optimizer, StateT]:
    """What an elastic script builds before er.init(): the model, distributed_sgd over it and
    a `state_type` (a TorchState) of both at step 0."""
    model = build_model()
    optimizer = distributed_sgd(model, momentum)
    return model, optimizer, state_type(model, optimizer, step=0)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: torch.Tensor,
               target: torch.Tensor) -> None:
    optimizer.zero_grad()
    F.cross_entropy(model(data), target).backward()
    optimizer.step()


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
    try:
        return float(Path(SLOW_DIR, f"slow-{host()}-{os.environ.get('LOCAL_RANK', '0')}")
                     .read_text())
    except (OSError, ValueError):
        return 1.0


def batch(rank: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s inputs and classes (for step `step`, where each step has its own)."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return (torch.randn(BATCH, IN_FEATURES, generator=generator).to(DEVICE),
            torch.randint(0, CLASSES, (BATCH,), generator=generator).to(DEVICE))


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
