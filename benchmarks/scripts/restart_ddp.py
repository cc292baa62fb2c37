"""A plain torchrun training script, as a user writes it: DDP on Gloo over an MLP, its own
checkpoint, no elasticrun import. benchmarks/restart.py runs it under torchrun and under
elasticrun and kills one of its workers.

Rank 0 saves {"model", "optimizer", "step"} to OUT/checkpoint.pt every --save-every steps
(a temporary file renamed over the old one); every rank loads it at start when present.

It prints, flushed, `phase <name> <time.time()> restart=<TORCHELASTIC_RESTART_COUNT>` on
rank 0 when each phase is done: start (every rank, its very first line, before
`import torch`, with its pid and rank), imports, init (init_process_group), model (model,
optimizer and DDP built), checkpoint (loaded, with the step it resumed from); and
`step <n> <time.time()> restart=<K>` after each step.

With --hold-after N, rank 1 of the first attempt waits (at most HOLD_S) after its step N,
so that its peers wait for it in step N + 1: the benchmark's kill lands at step N however
late it reads the output (a loaded machine reads it steps behind).
"""

from __future__ import annotations

import time

STARTED = time.time()
# ruff: noqa: E402  (the imports come after STARTED and the first line: a benchmark times them)

import os
import sys

RESTART = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
HOLD_S = 120.0
RANK = int(os.environ.get("RANK", "0"))


def say(line: str) -> None:
    sys.stdout.write(f"{line}\n")
    sys.stdout.flush()


def phase(name: str, at: float | None = None, **fields: object) -> None:
    if RANK == 0:
        extra = "".join(f" {key}={value}" for key, value in fields.items())
        say(f"phase {name} {time.time() if at is None else at:.6f} restart={RESTART}{extra}")


say(f"phase start {STARTED:.6f} restart={RESTART} pid={os.getpid()} rank={RANK}")

import argparse
from pathlib import Path

import torch
import torch.distributed as dist
from kit import load_checkpoint, parameter_count, save_checkpoint
from model import batch, mlp, train_step
from torch.nn.parallel import DistributedDataParallel


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=float, default=1e6, help="about this many parameters")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="adam")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--hold-after", type=int, default=0, metavar="N")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    phase("imports")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    phase("init", world=dist.get_world_size())
    torch.manual_seed(0)
    model = mlp(args.params)
    optimizer = (torch.optim.Adam(model.parameters(), lr=1e-4) if args.optimizer == "adam"
                 else torch.optim.SGD(model.parameters(), lr=0.01))
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters
    phase("model", params=parameter_count(model))
    args.out.mkdir(parents=True, exist_ok=True)
    checkpoint = args.out / "checkpoint.pt"
    step = load_checkpoint(checkpoint, model, optimizer, map_location="cpu")
    phase("checkpoint", step=step)
    while step < args.steps:
        data, target = batch(rank, step)
        train_step(ddp, optimizer, data, target)
        step += 1
        if rank == 0 and step % args.save_every == 0:
            save_checkpoint(checkpoint, model, optimizer, step)
        if rank == 0:
            say(f"step {step} {time.time():.6f} restart={RESTART}")
        if rank == 1 and step == args.hold_after and RESTART == "0":
            time.sleep(HOLD_S)  # the benchmark kills it meanwhile
    phase("done", steps=step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
