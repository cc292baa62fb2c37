"""The peer of elastic HSDP: torch's own 2-D HSDP under torchrun, no elasticity. The same model
and batches as er_hsdp_train.py; a (replicate, shard) DeviceMesh of gloo groups, every block
and the root fully_shard'ed on it, AdamW.

Env (besides hsdp_model.py's): BENCH_STEPS, BENCH_SHARD_SIZE (ranks per replica group).
Events: "started", "synced" (mesh and model built), "step" (rank 0 only), "done".
"""

from __future__ import annotations

import time

STARTED = time.time()

import gc  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from hsdp_model import batch, build_model, emit, parameter_count, shard  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

STEPS = int(os.environ.get("BENCH_STEPS", "40"))
SHARD_SIZE = int(os.environ.get("BENCH_SHARD_SIZE", "2"))


def main() -> None:
    emit("started", at=STARTED)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (size // SHARD_SIZE, SHARD_SIZE),
                            mesh_dim_names=("replicate", "shard"))
    model = build_model()
    params = parameter_count(model)
    shard(model, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    emit("synced", rank=rank, size=size)
    for step in range(STEPS):
        tokens, target = batch(rank, step)
        F.cross_entropy(model(tokens), target).backward()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            emit("step", rank=rank, size=size, step=step + 1)
    emit("done", rank=rank, params=params)
    # torch 2.13's Gloo threads can abort a process at interpreter exit without this.
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
