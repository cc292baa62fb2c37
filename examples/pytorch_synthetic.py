"""A small model on synthetic data: `elasticrun -np 2 python examples/pytorch_synthetic.py`."""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import elasticrun.torch as er


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    er.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * er.size())
    optimizer = er.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    er.broadcast_parameters(model.state_dict(), root_rank=0)
    er.broadcast_optimizer_state(optimizer, root_rank=0)

    generator = torch.Generator().manual_seed(1000 + er.rank())
    started = time.perf_counter()
    for step in range(args.steps):
        data = torch.randn(args.batch_size, 32, generator=generator)
        target = (data[:, :4].sum(dim=1) > 0).long() + 2 * (data[:, 4] > 0).long()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        average = er.allreduce(loss.detach())
        if er.rank() == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {average.item():.4f}  world size {er.size()}", flush=True)
    if er.rank() == 0:
        elapsed = time.perf_counter() - started
        print(f"done: {args.steps} steps in {elapsed:.2f}s on {er.size()} workers", flush=True)
    er.shutdown()


if __name__ == "__main__":
    main()
