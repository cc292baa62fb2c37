"""Elastic training on synthetic data: survives worker failures and host changes.

    elasticrun -np 2 --min-np 1 --host-discovery-script ./hosts.sh \
        python examples/pytorch_synthetic_elastic.py --epochs 5
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import elasticrun.torch as er


def make_dataset(samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(42)
    data = torch.randn(samples, 32, generator=generator)
    target = (data[:, :4].sum(dim=1) > 0).long() + 2 * (data[:, 4] > 0).long()
    return TensorDataset(data, target)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--base-lr", type=float, default=0.05)
    args = parser.parse_args()

    er.init()
    torch.manual_seed(0)
    dataset = make_dataset(args.samples)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = er.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.base_lr * er.size(), momentum=0.9),
        named_parameters=model.named_parameters())
    sampler = er.elastic.ElasticSampler(dataset, shuffle=True, seed=0)
    state = er.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0,
                                  loss=0.0)

    def rescale_learning_rate() -> None:
        for group in optimizer.param_groups:
            group["lr"] = args.base_lr * er.size()

    state.register_reset_callbacks([rescale_learning_rate])

    @er.elastic.run
    def train(state: er.elastic.TorchState) -> None:
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=state.sampler)
        while state.epoch < args.epochs:
            for batch_idx, (data, target) in enumerate(loader):
                optimizer.zero_grad()
                loss = F.cross_entropy(model(data), target)
                loss.backward()
                optimizer.step()
                state.sampler.record_batch(batch_idx, args.batch_size)
                state.batch += 1
                state.loss = loss.item()  # committed: an epoch resumed at its end has it
                state.commit()
            if er.rank() == 0:
                print(f"epoch {state.epoch}  loss {state.loss:.4f}  world size {er.size()}  "
                      f"steps {state.batch}", flush=True)
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    er.shutdown()


if __name__ == "__main__":
    main()
