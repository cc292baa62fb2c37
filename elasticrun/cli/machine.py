"""What torchrun's form asks of this machine: its GPUs and CPUs (for `--nproc-per-node
gpu|cpu|auto`, without importing torch), its name in a job, and whether an address is one
of its own (the rendezvous endpoint's: the node that owns it may host the driver)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one entry per GPU the driver sees


def gpu_count(environ: Mapping[str, str], gpus_dir: Path = NVIDIA_GPUS) -> int:
    """The GPUs a worker here may use: CUDA_VISIBLE_DEVICES's entries up to the first
    invalid one (as CUDA reads it), no more than the machine has; else the machine's."""
    try:
        present: int | None = sum(1 for _ in gpus_dir.iterdir())
    except OSError:
        present = None
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present or 0
    count = 0
    for entry in visible.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        count += 1
    return count if present is None else min(count, present)


def cpu_count() -> int:
    """The CPUs this process may run on (as torch._utils.cpu_count counts them)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def node_name(local_addr: str | None, environ: Mapping[str, str]) -> str:
    """This node's name in the job: --local-addr, else Slurm's name for it, else its host
    name."""
    return local_addr or environ.get("SLURMD_NODENAME") or socket.gethostname()


def resolve(host: str) -> list[str]:
    """The addresses `host` stands for (IPv4 first), [] when it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    found = [str(info[4][0]) for info in infos]
    ordered = sorted(dict.fromkeys(found), key=lambda address: ":" in address)
    return ordered


def own_address(addresses: list[str]) -> str | None:
    """The first of `addresses` this machine has: a socket can be bound to it (port 0:
    nothing is sent, nothing listens)."""
    for address in addresses:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((address, 0))
            except OSError:
                continue
            return address
    return None
