"""Which backend carries CUDA tensors, which GPU this worker uses, and how NCCL is told
not to kill the process on a peer's failure.

The choice is policy (pure functions, unit-tested); `Devices.detect()` reads the machine.
`--backend auto` (the default) picks NCCL for CUDA tensors when this worker has CUDA and
torch has NCCL, Gloo otherwise; `gloo` keeps every tensor on Gloo (CUDA tensors through host
memory); `nccl` demands NCCL and fails with one clear line where it cannot be had.
Each worker that uses CUDA is pinned to `cuda:<local rank>`; `ELASTICRUN_CUDA_DEVICE`
overrides that (`none`: leave the current device alone; an index: that device).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from elasticrun import protocol
from elasticrun.job.config import BACKENDS
from elasticrun.job.errors import ConfigError


@dataclass(frozen=True)
class DataPlane:
    """How this worker's rounds carry CUDA tensors (chosen once, at init)."""

    backend: str = "gloo"  # "nccl" or "gloo"
    device: torch.device | None = None  # the GPU this worker is pinned to
    agree: bool = False  # chosen by "auto": every round checks that all ranks chose NCCL


@dataclass(frozen=True)
class Devices:
    """What this process can use."""

    cuda: int  # CUDA devices visible to it (0: none)
    nccl: bool  # torch was built with NCCL

    @classmethod
    def detect(cls) -> Devices:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return cls(cuda=count, nccl=dist.is_nccl_available())


def choose_backend(requested: str, devices: Devices) -> str:
    """The backend for CUDA tensors: "nccl", or "gloo" (which also carries CPU tensors)."""
    if requested not in BACKENDS:
        raise ConfigError(f"{protocol.ENV_BACKEND}={requested!r}: expected one of "
                          f"{', '.join(BACKENDS)}")
    usable = devices.cuda > 0 and devices.nccl
    if requested == "nccl" and not usable:
        missing = "torch was built without NCCL" if not devices.nccl else "no CUDA device"
        raise ConfigError(f"--backend nccl: this worker cannot use NCCL ({missing}); use "
                          "--backend gloo or auto")
    if requested == "auto":
        return "nccl" if usable else "gloo"
    return requested


def device_index(setting: str | None, local_rank: int, devices: Devices,
                 backend: str) -> int | None:
    """The CUDA device this worker is pinned to (None: not pinned). `setting` is
    ELASTICRUN_CUDA_DEVICE: unset or "local_rank" (the default), "none", or an index."""
    if devices.cuda == 0:
        return None
    value = (setting or "local_rank").strip().lower()
    if value == "none":
        return None
    if value == "local_rank":
        index = local_rank
    else:
        try:
            index = int(value)
        except ValueError:
            raise ConfigError(f"{protocol.ENV_CUDA_DEVICE}={setting!r}: expected local_rank, "
                              "none or a device index") from None
    if 0 <= index < devices.cuda:
        return index
    if backend == "gloo" and value == "local_rank":
        return index % devices.cuda  # Gloo lets ranks share a GPU
    raise ConfigError(f"cuda:{index} does not exist: this host has {devices.cuda} CUDA "
                      f"device(s) (local rank {local_rank}); give the host at most "
                      f"{devices.cuda} slot(s) or set {protocol.ENV_CUDA_DEVICE}")


# torch's NCCL error handling, for in-process recovery: the watchdog may abort a failed
# communicator but must never take the process down (3, the default, does), the heartbeat
# monitor must not kill a process whose watchdog waits on a dead peer, and a timeout must
# not stop to write a debug dump. A value the user set is kept (and warned about).
NCCL_ENV = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",  # abort the communicator, keep the process
    "TORCH_NCCL_ENABLE_MONITORING": "0",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
    "TORCH_NCCL_RETHROW_CUDA_ERRORS": "0",
    "TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN": "0",
}


def nccl_environment(env: MutableMapping[str, str], timeout: float) -> list[str]:
    """Sets NCCL_ENV (and the non-blocking init's timeout) where `env` has no value; returns
    the names the user set to something else, which may stop in-process recovery."""
    wanted = {**NCCL_ENV, "TORCH_NCCL_NONBLOCKING_TIMEOUT": f"{max(1, round(timeout))}"}
    overridden = []
    for name, value in wanted.items():
        current = env.setdefault(name, value)
        if current != value and name in NCCL_ENV:
            overridden.append(f"{name}={current}")
    return overridden


def requested_backend(env: Mapping[str, str]) -> str:
    return env.get(protocol.ENV_BACKEND, "auto").strip().lower() or "auto"


def pin(index: int | None) -> torch.device | None:
    """Makes `index` this process's current CUDA device; returns it."""
    if index is None:
        return None
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def configure(local_rank: int, env: MutableMapping[str, str] | None = None
              ) -> tuple[DataPlane, list[str]]:
    """At init: how CUDA tensors travel and the device this worker is pinned to, and the
    NCCL settings the user overrode."""
    env = os.environ if env is None else env
    devices = Devices.detect()
    requested = requested_backend(env)
    backend = choose_backend(requested, devices)
    device = pin(device_index(env.get(protocol.ENV_CUDA_DEVICE), local_rank, devices, backend))
    overridden: list[str] = []
    if backend == "nccl":
        timeout = float(env.get(protocol.ENV_COLLECTIVE_TIMEOUT, "60"))
        overridden = nccl_environment(env, timeout)
    return DataPlane(backend, device, agree=requested == "auto"), overridden
