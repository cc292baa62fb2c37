"""An unmodified torchrun-style script: env:// rendezvous, DDP, plain torch.distributed."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(2):
        gen = torch.Generator().manual_seed(10 * step + rank)
        x = torch.randn(4, 3, generator=gen)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
    value = torch.tensor([float(rank)])
    dist.all_reduce(value)
    print(f"torchrun-style rank={rank} world={world} sum={value.item():g}", flush=True)
    dist.destroy_process_group()
    # PyTorch's Gloo backend can abort at interpreter exit ("terminate called without an
    # active exception") when a worker thread still has to drop a finished collective; plain
    # torchrun jobs fail the same way. A moment's sleep lets it finish before Python exits.
    time.sleep(0.2)


if __name__ == "__main__":
    main()
