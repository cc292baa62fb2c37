"""An unmodified torchrun-style DDP loop (no elasticrun import) with a "device time" per
step the test changes per worker: see paced_control.py."""

from __future__ import annotations

import time

import paced_control as ctl
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    args = ctl.parse()
    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(16, 16))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, args.steps + 1):
        ctl.device_time(args.control, args.step_s)
        optimizer.zero_grad()
        model(ctl.batch(step)).pow(2).mean().backward()
        optimizer.step()
        ctl.said(step, dist.get_rank(), dist.get_world_size())
        stop = ctl.stopping(args.control)
        dist.all_reduce(stop)
        if stop.item() > 0:
            break
    dist.destroy_process_group()
    time.sleep(0.2)  # (torch 2.13's Gloo threads at exit: see torchrun_style.py)


if __name__ == "__main__":
    main()
