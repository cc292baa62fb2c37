"""The peer of benchmarks/total_loss.py: er_total_loss_train.py's model, batch and optimizer
under torchrun, as a user writes it: plain DDP on Gloo, and a torch.distributed.checkpoint
(DCP) save of model, optimizer and step every BENCH_CHECKPOINT_EVERY steps into
BENCH_CHECKPOINT_DIR/step-N; at start every rank loads the newest complete one (the one
whose .metadata, written last, is there) when there is one.

Env (besides model.py's and kit.py's): BENCH_CHECKPOINT_EVERY, BENCH_CHECKPOINT_DIR,
BENCH_KILL_STEP with BENCH_MARKER_DIR: every rank SIGKILLs itself at the start of that step,
once per rank in the job. Events: "started" (first line, before torch is imported, with the
restart count), "initialized" (process group built), "synced" (checkpoint loaded: the step
resumed from), "kill", "step" (with the save's duration), "done".
"""

from __future__ import annotations

import time

STARTED = time.time()
# ruff: noqa: E402  (the imports come after STARTED: a benchmark times them)

from pathlib import Path
from typing import Any

import kit
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from kit import emit
from model import STEPS, batch, build_model, train_step
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

CHECKPOINT_EVERY = kit.env_int("BENCH_CHECKPOINT_EVERY", 10)
CHECKPOINT_DIR = kit.env_path("BENCH_CHECKPOINT_DIR", "/tmp")
MARKER_DIR = kit.env_path("BENCH_MARKER_DIR", "/tmp")
RESTART = kit.env_int("TORCHELASTIC_RESTART_COUNT", 0)


def newest_checkpoint() -> Path | None:
    complete = [path for path in CHECKPOINT_DIR.glob("step-*") if (path / ".metadata").exists()]
    return max(complete, key=lambda path: int(path.name.split("-")[1]), default=None)


def full_state(ddp: DistributedDataParallel, optimizer: torch.optim.Optimizer,
               step: int) -> dict[str, Any]:
    model_state, optimizer_state = get_state_dict(ddp, optimizer)
    return {"model": model_state, "optimizer": optimizer_state, "step": torch.tensor(step)}


def save(ddp: DistributedDataParallel, optimizer: torch.optim.Optimizer, step: int) -> None:
    dcp.save(full_state(ddp, optimizer, step), checkpoint_id=CHECKPOINT_DIR / f"step-{step}")


def load(ddp: DistributedDataParallel, optimizer: torch.optim.Optimizer) -> int:
    """The step of the newest complete checkpoint, loaded into model and optimizer (0: none)."""
    path = newest_checkpoint()
    if path is None:
        return 0
    state = full_state(ddp, optimizer, 0)
    dcp.load(state, checkpoint_id=path)
    set_state_dict(ddp, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])
    return int(state["step"])


def main() -> None:
    emit("started", at=STARTED, restart=RESTART)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    emit("initialized", rank=rank, restart=RESTART)
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters
    step = load(ddp, optimizer)
    emit("synced", rank=rank, step=step, restart=RESTART)
    data, target = batch(rank)
    while step < STEPS:
        if step == kit.KILL_STEP and kit.first_time(MARKER_DIR / f"killed-{rank}"):
            kit.signal_self("kill", rank=rank, step=step)
        train_step(ddp, optimizer, data, target)
        step += 1
        save_s = 0.0
        if kit.due(step, CHECKPOINT_EVERY):
            save_s = kit.timed(save, ddp, optimizer, step)
        emit("step", rank=rank, step=step, restart=RESTART, commit_s=save_s)
    emit("done", rank=rank, params=kit.parameter_count(model))
    del ddp
    kit.close_process_group()


if __name__ == "__main__":
    main()
