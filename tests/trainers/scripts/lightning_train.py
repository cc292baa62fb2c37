"""A torchrun training script for Lightning: a tiny MLP, DDP on Gloo over CPU, random data.

Lightning takes its ranks from torchrun's environment (TorchElasticEnvironment); its
ModelCheckpoint writes OUT/last.ckpt every --save-every steps (0: Lightning's default
checkpointing, once an epoch), and the script resumes from it at start when it exists. With
--flash, elasticrun's ElasticCallback is added (the one line a user adds).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 16
SAMPLES = 256


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--flash", action="store_true",
                        help="add elasticrun's ElasticCallback (flash commits)")
    return parser.parse_args()


def say(line: str) -> None:
    sys.stdout.write(f"{line}\n")
    sys.stdout.flush()


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Progress(Callback):
    def __init__(self, step_sleep: float) -> None:
        self.step_sleep = step_sleep
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.rank == 0:
            say(f"start resumed_from={trainer.global_step} world={self.world}")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        say(f"step {trainer.global_step} rank {self.rank} restart {self.restart}")
        if self.step_sleep:
            time.sleep(self.step_sleep)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.rank == 0:
            say(f"done steps={trainer.global_step} world={self.world}")


def checkpointing(args: argparse.Namespace) -> list[Callback]:
    """ModelCheckpoint every --save-every steps; 0: Lightning's default (once an epoch)."""
    if not args.save_every:
        return []
    return [ModelCheckpoint(dirpath=args.out, every_n_train_steps=args.save_every,
                            save_last=True, save_top_k=1)]


def flash_callbacks(flash: bool) -> list[Callback]:
    if not flash:
        return []
    from elasticrun.integrations.lightning import ElasticCallback
    return [ElasticCallback()]


def main() -> None:
    args = parse_args()
    L.seed_everything(0, verbose=False)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)
    local_world = int(os.environ["LOCAL_WORLD_SIZE"])
    trainer = L.Trainer(
        accelerator="cpu",
        strategy=DDPStrategy(process_group_backend="gloo"),
        devices=local_world,
        num_nodes=int(os.environ["WORLD_SIZE"]) // local_world,
        max_steps=args.steps,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        default_root_dir=args.out,
        callbacks=[*checkpointing(args), *flash_callbacks(args.flash), Progress(args.step_sleep)],
    )
    last = args.out / "last.ckpt"
    trainer.fit(Regression(), loader, ckpt_path=last if last.is_file() else None)


if __name__ == "__main__":
    main()
