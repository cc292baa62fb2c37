"""Horovod's build and runtime queries, answered for elasticrun: its data plane is
torch.distributed's Gloo (every tensor) and, where torch has it, NCCL (CUDA tensors), with
no MPI, DDL, oneCCL or ROCm code of its own. Scripts use these to choose code paths
(`if hvd.nccl_built(): ...`)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from elasticrun.torch.world import runtime


def gloo_built() -> bool:
    """True: elasticrun's data plane is torch.distributed's Gloo."""
    return True


def gloo_enabled() -> bool:
    """True: every job uses Gloo (NCCL, where torch has it, carries CUDA tensors)."""
    return True


def mpi_built() -> bool:
    """False: elasticrun has no MPI."""
    return False


def mpi_enabled() -> bool:
    """False: elasticrun has no MPI."""
    return False


def mpi_threads_supported() -> bool:
    """Horovod raises ValueError when MPI is not enabled; so does elasticrun, which has none."""
    raise ValueError("elasticrun does not use MPI (mpi_enabled() is False), so there is no "
                     "MPI threading to query")


def nccl_built() -> bool:
    """Whether CUDA tensors can travel on NCCL (torch was built with it)."""
    return dist.is_nccl_available()


def cuda_built() -> bool:
    """Whether CUDA tensors are supported (on NCCL, or through host memory on Gloo)."""
    return torch.backends.cuda.is_built()


def rocm_built() -> bool:
    """False: elasticrun has no ROCm code of its own."""
    return False


def ddl_built() -> bool:
    """False: elasticrun has no DDL."""
    return False


def ccl_built() -> bool:
    """False: elasticrun has no oneCCL."""
    return False


def is_initialized() -> bool:
    return runtime.is_initialized()


def is_homogeneous() -> bool:
    """Whether every host runs the same number of ranks."""
    slot = runtime.current().slot
    return slot.size == slot.local_size * slot.cross_size
