"""The peer: the same model under torchrun, as a user writes it — plain DDP, and a disk
checkpoint every BENCH_CHECKPOINT_EVERY steps that a restarted worker resumes from.

Env (besides model.py's): BENCH_CHECKPOINT_EVERY (0: never), BENCH_CHECKPOINT_DIR. A
marker file in the checkpoint directory makes the kill happen once. Events as
er_train.py's: "started", "imported" (model and optimizer built too), "initialized"
(process group built), "synced" (checkpoint loaded, step restored), "kill", "step",
"done".
"""

from __future__ import annotations

import time

STARTED = time.time()

import gc  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from model import (  # noqa: E402
    DEVICE,
    KILL_RANK,
    KILL_STEP,
    STEPS,
    STEPS_AT_TARGET,
    TARGET_SIZE,
    StepProfile,
    batch,
    build_model,
    emit,
    parameter_count,
)
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

CHECKPOINT_EVERY = int(os.environ.get("BENCH_CHECKPOINT_EVERY", "10"))
CHECKPOINT_DIR = Path(os.environ.get("BENCH_CHECKPOINT_DIR", "/tmp"))
# Not TORCHELASTIC_RESTART_COUNT: an agent restarting for another agent's failure does not
# count a restart, so its workers would see 0 again.
KILLED_MARKER = CHECKPOINT_DIR / "killed"


def main() -> None:
    emit("started", at=STARTED)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    emit("imported")
    dist.init_process_group("nccl" if DEVICE.type == "cuda" else "gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    emit("initialized", rank=rank, size=size)
    step = 0
    checkpoint = CHECKPOINT_DIR / "checkpoint.pt"
    if checkpoint.exists():
        saved = torch.load(checkpoint, map_location=DEVICE)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step = saved["step"]
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters
    emit("synced", rank=rank, size=size, step=step)
    data, target = batch(rank)
    at_target = 0
    profile = StepProfile(rank)
    while step < STEPS and not (TARGET_SIZE and at_target >= STEPS_AT_TARGET):
        if step == KILL_STEP and rank == KILL_RANK and not KILLED_MARKER.exists():
            KILLED_MARKER.touch()
            emit("kill", rank=rank, step=step)
            os.kill(os.getpid(), signal.SIGKILL)
        profile.at(step)
        optimizer.zero_grad()
        F.cross_entropy(ddp(data), target).backward()
        optimizer.step()
        step += 1
        save_s = 0.0
        if rank == 0 and CHECKPOINT_EVERY and step % CHECKPOINT_EVERY == 0:
            started = time.perf_counter()
            partial = checkpoint.with_suffix(".partial")
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": step}, partial)
            os.replace(partial, checkpoint)
            save_s = time.perf_counter() - started
        at_target += size == TARGET_SIZE
        emit("step", rank=rank, size=size, step=step, commit_s=save_s)
    emit("done", rank=rank, params=parameter_count(model))
    # Without this, torch 2.13's Gloo threads can abort the process at interpreter exit
    # ("terminate called without an active exception"), which torchrun takes for a failure.
    del ddp
    gc.collect()
    dist.destroy_process_group()
    gc.collect()


if __name__ == "__main__":
    main()
