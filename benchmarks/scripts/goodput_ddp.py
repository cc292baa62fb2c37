"""The goodput benchmark's torchrun-style script (benchmarks/goodput.py), as a user writes
it: plain DDP on Gloo over model.py's MLP, its own disk checkpoint, no elasticrun import
(but with BENCH_FLASH=1: elasticrun.flash.FlashCommits, a flash commit of every step).
It runs under torchrun and under elasticrun (restart mode) alike, until told to stop.

Rank 0 saves {"model", "optimizer", "step"} every BENCH_CHECKPOINT_EVERY steps (default 10;
a temporary file, fsynced, renamed over the old one); every rank resumes from it at start.
The process group's timeout is BENCH_PG_TIMEOUT_S (default 60 s): torchrun has no hang
detection, so a hung peer costs this long.

Env (besides model.py's BENCH_PARAMS, BENCH_OUT and BENCH_DEVICE_S): BENCH_STOP_FILE (when
it exists at a check, every STOP_EVERY steps, every rank stops there: rank 0 looks and tells
the others), BENCH_CHECKPOINT_DIR, BENCH_HOST (the "host" of this worker under torchrun;
elasticrun sets ELASTICRUN_HOSTNAME). Events, each with the worker's host: "started" (every
rank, its first line), "synced" (rank 0: checkpoint loaded, the step resumed from), "step"
(rank 0, every step, with the world size), "done" (rank 0).
"""

from __future__ import annotations

import time

STARTED = time.time()

import gc  # noqa: E402
import os  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from model import batch, build_model, device_time, emit  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

HOST = os.environ.get("ELASTICRUN_HOSTNAME") or os.environ.get("BENCH_HOST", "")
STOP_FILE = Path(os.environ["BENCH_STOP_FILE"])
CHECKPOINT_EVERY = int(os.environ.get("BENCH_CHECKPOINT_EVERY", "10"))
CHECKPOINT = Path(os.environ["BENCH_CHECKPOINT_DIR"]) / "checkpoint.pt"
PG_TIMEOUT_S = float(os.environ.get("BENCH_PG_TIMEOUT_S", "60"))
STOP_EVERY = 10  # steps between stop checks: a broadcast, kept out of most steps


def note(event: str, **fields: object) -> None:
    emit(event, host=HOST, **fields)


def save_atomically(state: dict[str, object]) -> None:
    partial = CHECKPOINT.with_name(f".{CHECKPOINT.name}.partial")
    with open(partial, "wb") as file:
        torch.save(state, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, CHECKPOINT)


def main() -> None:
    note("started", at=STARTED, rank=int(os.environ.get("RANK", "-1")))
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dist.init_process_group("gloo", timeout=timedelta(seconds=PG_TIMEOUT_S))
    rank, size = dist.get_rank(), dist.get_world_size()
    step = 0
    if CHECKPOINT.exists():
        saved = torch.load(CHECKPOINT)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step = int(saved["step"])
    flash = None
    if os.environ.get("BENCH_FLASH") == "1":  # the one line more of a plain loop's user
        from elasticrun.flash import FlashCommits
        flash = FlashCommits(model=model, optimizer=optimizer)
        step = flash.restore(step)
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters
    if rank == 0:
        note("synced", rank=rank, size=size, step=step)
    data, target = batch(rank)
    stop = torch.zeros(1)
    while True:
        device_time()
        optimizer.zero_grad()
        F.cross_entropy(ddp(data), target).backward()
        optimizer.step()
        step += 1
        if flash is not None:
            flash.commit(step)
        if rank == 0 and step % CHECKPOINT_EVERY == 0:
            save_atomically({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                             "step": step})
        if rank == 0:
            note("step", rank=rank, size=size, step=step)
        if step % STOP_EVERY == 0:
            stop.fill_(float(rank == 0 and STOP_FILE.exists()))
            dist.broadcast(stop, 0)
            if stop.item():
                break
    if rank == 0:
        note("done", rank=rank, step=step)
    # Without this, torch 2.13's Gloo threads can abort the process at interpreter exit
    # ("terminate called without an active exception"), which torchrun takes for a failure.
    del ddp
    gc.collect()
    dist.destroy_process_group()
    gc.collect()


if __name__ == "__main__":
    main()
