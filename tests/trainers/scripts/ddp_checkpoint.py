"""A plain torchrun training script: DDP over a small MLP on Gloo, its own checkpoint.

Rank 0 saves {"model", "optimizer", "step"} to OUT/checkpoint.pt every --save-every steps
(written to a temporary file, fsynced, then renamed over the old one); every rank loads it
at start when present and goes on from its step. With --flash it keeps its state every step
with elasticrun.flash.FlashCommits and goes on from the newer of the two.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

FEATURES = 16
BATCH = 8


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--flash", action="store_true",
                        help="keep the state every step with elasticrun.flash.FlashCommits")
    return parser.parse_args()


def say(line: str) -> None:
    sys.stdout.write(f"{line}\n")
    sys.stdout.flush()


def save_atomically(state: dict[str, object], path: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(BATCH, FEATURES, generator=generator)
    return x, x.sum(dim=1, keepdim=True)


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    args.out.mkdir(parents=True, exist_ok=True)
    checkpoint = args.out / "checkpoint.pt"

    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    if checkpoint.exists():
        state = torch.load(checkpoint, map_location="cpu")
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
    flash = None
    if args.flash:
        from elasticrun.flash import FlashCommits
        flash = FlashCommits(model=model.module, optimizer=optimizer)
        step = flash.restore(step)
    if rank == 0:
        say(f"start resumed_from={step} world={world}")

    while step < args.steps:
        step += 1
        x, y = batch(step, rank)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        say(f"step {step} rank {rank} restart {restart}")
        if flash is not None:
            flash.commit(step)
        if rank == 0 and step % args.save_every == 0:
            save_atomically(
                {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                 "step": step},
                checkpoint,
            )
        if args.step_sleep:
            time.sleep(args.step_sleep)

    if rank == 0:
        weights = sum(float(p.double().sum()) for p in model.parameters())
        say(f"done steps={step} world={world} weights={weights:.12e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
