"""The peer: the same model under torchrun, as a user writes it — plain DDP, and a disk
checkpoint every BENCH_CHECKPOINT_EVERY steps that a restarted worker resumes from.

Env (besides model.py's and kit.py's): BENCH_CHECKPOINT_EVERY (0: never),
BENCH_CHECKPOINT_DIR. A marker file in the checkpoint directory makes the kill happen once.
Events as er_train.py's: "started", "imported" (model and optimizer built too),
"initialized" (process group built), "synced" (checkpoint loaded, step restored), "kill",
"step", "done".
"""

from __future__ import annotations

import time

STARTED = time.time()
# ruff: noqa: E402  (the imports come after STARTED: a benchmark times them)

import kit
import torch
import torch.distributed as dist
from kit import emit
from model import (
    DEVICE,
    STEPS,
    STEPS_AT_TARGET,
    TARGET_SIZE,
    StepProfile,
    batch,
    build_model,
    train_step,
)
from torch.nn.parallel import DistributedDataParallel

CHECKPOINT_EVERY = kit.env_int("BENCH_CHECKPOINT_EVERY", 10)
CHECKPOINT_DIR = kit.env_path("BENCH_CHECKPOINT_DIR", "/tmp")
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
    checkpoint = CHECKPOINT_DIR / "checkpoint.pt"
    step = kit.load_checkpoint(checkpoint, model, optimizer, map_location=DEVICE)
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters
    emit("synced", rank=rank, size=size, step=step)
    data, target = batch(rank)
    at_target = 0
    profile = StepProfile(rank)
    while step < STEPS and not (TARGET_SIZE and at_target >= STEPS_AT_TARGET):
        if step == kit.KILL_STEP and rank == kit.KILL_RANK and kit.first_time(KILLED_MARKER):
            kit.signal_self("kill", rank=rank, step=step)
        profile.at(step)
        train_step(ddp, optimizer, data, target)
        step += 1
        save_s = 0.0
        if rank == 0 and kit.due(step, CHECKPOINT_EVERY):
            save_s = kit.timed(kit.save_checkpoint, checkpoint, model, optimizer, step,
                               fsync=False)
        at_target += size == TARGET_SIZE
        emit("step", rank=rank, size=size, step=step, commit_s=save_s)
    emit("done", rank=rank, params=kit.parameter_count(model))
    del ddp
    kit.close_process_group()


if __name__ == "__main__":
    main()
