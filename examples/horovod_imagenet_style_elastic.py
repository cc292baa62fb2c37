"""An elastic training script in the style of Horovod's
examples/elastic/pytorch/pytorch_imagenet_resnet50_elastic.py, with synthetic images and a
small conv net with BatchNorm. Only the import differs from a Horovod script:

    import elasticrun.torch as hvd      # was: import horovod.torch as hvd

    elasticrun -np 4 --min-np 2 --host-discovery-script ./hosts.sh \
        python examples/horovod_imagenet_style_elastic.py --fp16-allreduce

It uses what those scripts use: a `Metric` averaged through `hvd.allreduce(..., name=...)`,
train and validation ElasticSamplers, LR warm-up recomputed in a reset callback,
`Compression.fp16`, `Adasum`, `gradient_predivide_factor`, `backward_passes_per_step` with
sub-batches, and `hvd.elastic.TorchState` with extra objects.

For tests: `--digest-dir DIR` makes every rank write a digest of its final parameters;
`--kill START_RANK:EPOCH:BATCH` makes the worker that started with that rank SIGKILL itself
there, once (a marker file in --digest-dir remembers it).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import signal
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import elasticrun.torch as hvd

parser = argparse.ArgumentParser(description="ImageNet-style elastic example (synthetic)")
parser.add_argument("--batch-size", type=int, default=8, help="input batch size for training")
parser.add_argument("--val-batch-size", type=int, default=16)
parser.add_argument("--batches-per-allreduce", type=int, default=1,
                    help="number of batches processed locally before allreduce")
parser.add_argument("--batches-per-commit", type=int, default=2)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--base-lr", type=float, default=0.0125)
parser.add_argument("--warmup-epochs", type=float, default=1)
parser.add_argument("--momentum", type=float, default=0.9)
parser.add_argument("--wd", type=float, default=0.00005)
parser.add_argument("--samples", type=int, default=256)
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--use-adasum", action="store_true")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0)
parser.add_argument("--sync-bn", action="store_true", help="use hvd.SyncBatchNorm")
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--digest-dir", default="")
parser.add_argument("--kill", default="", help="START_RANK:EPOCH:BATCH")
args = parser.parse_args()

hvd.init()
torch.manual_seed(args.seed)
allreduce_batch_size = args.batch_size * args.batches_per_allreduce


def synthetic_images(samples: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(samples, 3, 16, 16, generator=generator)
    labels = (images.mean(dim=(1, 2, 3)) > 0).long() + 2 * (images[:, 0, 0, 0] > 0).long()
    return TensorDataset(images, labels)


train_dataset = synthetic_images(args.samples, 1)
train_sampler = hvd.elastic.ElasticSampler(train_dataset)
train_loader = DataLoader(train_dataset, batch_size=allreduce_batch_size, sampler=train_sampler)
val_dataset = synthetic_images(args.samples // 4, 2)
val_sampler = hvd.elastic.ElasticSampler(val_dataset, shuffle=False)
val_loader = DataLoader(val_dataset, batch_size=args.val_batch_size, sampler=val_sampler)

norm = hvd.SyncBatchNorm if args.sync_bn else nn.BatchNorm2d
model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1), norm(16), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), norm(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
    nn.Flatten(), nn.Linear(32, 4))

# Horovod: scale the learning rate by the number of workers (Adasum does not need it).
lr_scaler = args.batches_per_allreduce * hvd.size() if not args.use_adasum else 1
if args.use_adasum and hvd.nccl_built():
    lr_scaler = args.batches_per_allreduce * hvd.local_size()
optimizer = torch.optim.SGD(model.parameters(), lr=args.base_lr * lr_scaler,
                            momentum=args.momentum, weight_decay=args.wd)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(
    optimizer, named_parameters=model.named_parameters(), compression=compression,
    backward_passes_per_step=args.batches_per_allreduce,
    op=hvd.Adasum if args.use_adasum else hvd.Average,
    gradient_predivide_factor=args.gradient_predivide_factor)


class Metric:
    """Horovod's examples average metrics over ranks with a named allreduce."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sum = torch.tensor(0.0)
        self.n = torch.tensor(0.0)

    def update(self, val: torch.Tensor) -> None:
        self.sum += hvd.allreduce(val.detach().cpu(), name=self.name)
        self.n += 1

    @property
    def avg(self) -> torch.Tensor:
        return self.sum / self.n


def accuracy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return output.max(1, keepdim=True)[1].eq(target.view_as(output.max(1, keepdim=True)[1])) \
        .float().mean()


def adjust_learning_rate(epoch: int, batch_idx: int) -> None:
    """Horovod's warm-up: from base_lr to base_lr * size over warmup_epochs, then decay."""
    if epoch < args.warmup_epochs:
        epoch += float(batch_idx + 1) / max(1, len(train_loader))
        lr_adj = 1.0 / hvd.size() * (epoch * (hvd.size() - 1) / args.warmup_epochs + 1)
    elif epoch < 30:
        lr_adj = 1.0
    else:
        lr_adj = 1e-1
    for param_group in optimizer.param_groups:
        param_group["lr"] = args.base_lr * hvd.size() * args.batches_per_allreduce * lr_adj


def maybe_killed(epoch: int, batch: int) -> None:
    if not args.kill:
        return
    start_rank, at_epoch, at_batch = (int(part) for part in args.kill.split(":"))
    marker = Path(args.digest_dir) / "killed"
    if (int(os.environ.get("HOROVOD_RANK", -1)), epoch, batch) == (start_rank, at_epoch,
                                                                   at_batch) \
            and not marker.exists():
        marker.write_text(f"{hvd.rank()}\n")
        os.kill(os.getpid(), signal.SIGKILL)


def train(state: hvd.elastic.TorchState) -> None:
    model.train()
    epoch = state.epoch
    train_loss = Metric("train_loss")
    train_accuracy = Metric("train_accuracy")
    batch_offset = state.batch
    for idx, (data, target) in enumerate(train_loader):
        # Elastic Horovod: update the current batch index this epoch and commit.
        state.batch = batch_idx = batch_offset + idx
        if args.batches_per_commit > 0 and state.batch % args.batches_per_commit == 0:
            state.commit()
        maybe_killed(epoch, batch_idx)
        adjust_learning_rate(epoch, batch_idx)
        optimizer.zero_grad()
        # Split data into sub-batches of size batch_size
        for i in range(0, len(data), args.batch_size):
            data_batch = data[i:i + args.batch_size]
            target_batch = target[i:i + args.batch_size]
            output = model(data_batch)
            train_accuracy.update(accuracy(output, target_batch))
            loss = F.cross_entropy(output, target_batch)
            train_loss.update(loss)
            # Average gradients among sub-batches
            loss.div_(math.ceil(float(len(data)) / args.batch_size))
            loss.backward()
        # Elastic Horovod: record which samples were processed this batch
        state.train_sampler.record_batch(idx, allreduce_batch_size)
        # Gradient is applied across all ranks
        optimizer.step()
    if hvd.rank() == 0:
        print(f"epoch {epoch}: train loss {train_loss.avg.item():.4f} accuracy "
              f"{100 * train_accuracy.avg.item():.1f}% on {hvd.size()} worker(s)", flush=True)


def validate(epoch: int) -> None:
    model.eval()
    val_loss = Metric("val_loss")
    val_accuracy = Metric("val_accuracy")
    with torch.no_grad():
        for data, target in val_loader:
            output = model(data)
            val_loss.update(F.cross_entropy(output, target))
            val_accuracy.update(accuracy(output, target))
    if hvd.rank() == 0:
        print(f"epoch {epoch}: val loss {val_loss.avg.item():.4f} accuracy "
              f"{100 * val_accuracy.avg.item():.1f}%", flush=True)


def end_of_epoch(state: hvd.elastic.TorchState) -> None:
    state.epoch += 1
    state.batch = 0
    state.train_sampler.set_epoch(state.epoch)
    state.commit()


@hvd.elastic.run
def full_train(state: hvd.elastic.TorchState) -> None:
    while state.epoch < args.epochs:
        train(state)
        validate(state.epoch)
        end_of_epoch(state)


def on_state_reset() -> None:
    # Horovod: scale the learning rate as controlled by the LR schedule
    for param_group in optimizer.param_groups:
        param_group["lr"] = args.base_lr * hvd.size() * args.batches_per_allreduce


state = hvd.elastic.TorchState(model=model, optimizer=optimizer, train_sampler=train_sampler,
                               val_sampler=val_sampler, epoch=0, batch=0)
state.register_reset_callbacks([on_state_reset])
full_train(state)

if args.digest_dir:
    digest = hashlib.sha256()
    for tensor in model.parameters():
        digest.update(tensor.detach().numpy().tobytes())
    if args.sync_bn:
        for tensor in model.buffers():
            digest.update(tensor.detach().numpy().tobytes())
    out = Path(args.digest_dir) / f"rank{hvd.rank()}.txt"
    out.write_text(f"{digest.hexdigest()} {hvd.size()}\n")
