"""The peer of elastic HSDP: torch's own 2-D HSDP under torchrun, no elasticity. The same model
and batches as er_hsdp_train.py; a (replicate, shard) DeviceMesh of gloo groups, every block
and the root fully_shard'ed on it, AdamW.

Env (besides hsdp_model.py's and kit.py's): BENCH_SHARD_SIZE (ranks per replica group).
Events: "started", "synced" (mesh and model built), "step" (rank 0 only), "done".
"""

from __future__ import annotations

import time

STARTED = time.time()
# ruff: noqa: E402  (the imports come after STARTED: a benchmark times them)

import kit
import torch
import torch.distributed as dist
from hsdp_model import STEPS, build_model, shard, train_step
from kit import emit
from torch.distributed.device_mesh import init_device_mesh

SHARD_SIZE = kit.env_int("BENCH_SHARD_SIZE", 2)


def main() -> None:
    emit("started", at=STARTED)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (size // SHARD_SIZE, SHARD_SIZE),
                            mesh_dim_names=("replicate", "shard"))
    model = build_model()
    params = kit.parameter_count(model)
    shard(model, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    emit("synced", rank=rank, size=size)
    for step in range(STEPS):
        train_step(model, optimizer, rank, step)
        if rank == 0:
            emit("step", rank=rank, size=size, step=step + 1)
    emit("done", rank=rank, params=params)
    del model, optimizer
    kit.close_process_group()


if __name__ == "__main__":
    main()
