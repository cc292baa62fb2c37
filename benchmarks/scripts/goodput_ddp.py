"""The goodput benchmark's torchrun-style script (benchmarks/goodput.py), as a user writes
it: plain DDP on Gloo over model.py's MLP, its own disk checkpoint, no elasticrun import
(but with BENCH_FLASH=1: elasticrun.flash.FlashCommits, a flash commit of every step).
It runs under torchrun and under elasticrun (restart mode) alike, until told to stop.

Rank 0 saves {"model", "optimizer", "step"} every BENCH_CHECKPOINT_EVERY steps (default 10;
a temporary file, fsynced, renamed over the old one); every rank resumes from it at start.
The process group's timeout is BENCH_PG_TIMEOUT_S (default 60 s): torchrun has no hang
detection, so a hung peer costs this long.

Env (besides model.py's BENCH_PARAMS, BENCH_DEVICE_S and kit.py's BENCH_OUT): BENCH_STOP_FILE
(when it exists at a check, every STOP_EVERY steps, every rank stops there: rank 0 looks and
tells the others), BENCH_CHECKPOINT_DIR, BENCH_HOST (the "host" of this worker under
torchrun; elasticrun sets ELASTICRUN_HOSTNAME). Events, each with the worker's host:
"started" (every rank, its first line), "synced" (rank 0: checkpoint loaded, the step resumed
from), "step" (rank 0, every step, with the world size), "done" (rank 0).
"""

from __future__ import annotations

import time

STARTED = time.time()
# ruff: noqa: E402  (the imports come after STARTED: a benchmark times them)

import os
from datetime import timedelta

import kit
import torch
import torch.distributed as dist
from kit import emit
from model import batch, build_model, device_time, train_step
from torch.nn.parallel import DistributedDataParallel

HOST = kit.host()
STOP_FILE = kit.env_path("BENCH_STOP_FILE")
CHECKPOINT_EVERY = kit.env_int("BENCH_CHECKPOINT_EVERY", 10)
CHECKPOINT = kit.env_path("BENCH_CHECKPOINT_DIR") / "checkpoint.pt"
PG_TIMEOUT_S = kit.env_float("BENCH_PG_TIMEOUT_S", 60.0)
STOP_EVERY = 10  # steps between stop checks: a broadcast, kept out of most steps


def main() -> None:
    emit("started", host=HOST, at=STARTED, rank=int(os.environ.get("RANK", "-1")))
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dist.init_process_group("gloo", timeout=timedelta(seconds=PG_TIMEOUT_S))
    rank, size = dist.get_rank(), dist.get_world_size()
    step = kit.load_checkpoint(CHECKPOINT, model, optimizer)
    flash = None
    if os.environ.get("BENCH_FLASH") == "1":  # the one line more of a plain loop's user
        from elasticrun.flash import FlashCommits
        flash = FlashCommits(model=model, optimizer=optimizer)
        step = flash.restore(step)
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters
    if rank == 0:
        emit("synced", host=HOST, rank=rank, size=size, step=step)
    data, target = batch(rank)
    stop = torch.zeros(1)
    while True:
        device_time()
        train_step(ddp, optimizer, data, target)
        step += 1
        if flash is not None:
            flash.commit(step)
        if rank == 0 and kit.due(step, CHECKPOINT_EVERY):
            kit.save_checkpoint(CHECKPOINT, model, optimizer, step)
        if rank == 0:
            emit("step", host=HOST, rank=rank, size=size, step=step)
        if step % STOP_EVERY == 0:
            stop.fill_(float(rank == 0 and STOP_FILE.exists()))
            dist.broadcast(stop, 0)
            if stop.item():
                break
    if rank == 0:
        emit("done", host=HOST, rank=rank, step=step)
    del ddp
    kit.close_process_group()


if __name__ == "__main__":
    main()
