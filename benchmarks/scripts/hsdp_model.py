"""What the HSDP benchmark's scripts share: a small transformer LM sized by name, each rank's
batch of synthetic tokens, FSDP2 sharding on a given mesh and the settings (kit.py has what
every script shares).

Env: BENCH_SIZE (a key of SIZES), BENCH_BATCH (sequences per rank and step), BENCH_STEPS
(steps to train).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from kit import env_int
from torch import nn

# name -> (hidden, blocks): embedding + blocks of attention and MLP (12 hidden^2 each) + head
SIZES = {"0.1M": (64, 1), "1M": (256, 1), "4M": (384, 2), "16M": (512, 5)}
VOCAB = 512
SEQ = 32
HEADS = 4
SIZE = os.environ.get("BENCH_SIZE", "1M")
BATCH = env_int("BENCH_BATCH", 8)
STEPS = env_int("BENCH_STEPS", 40)


class Block(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden)
        self.attn = nn.MultiheadAttention(hidden, HEADS, batch_first=True)
        self.norm2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(),
                                 nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class LM(nn.Module):
    def __init__(self, hidden: int, blocks: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, hidden)
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(blocks))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).flatten(0, 1))  # not a view: FSDP's root hooks hold


def build_model() -> LM:
    torch.manual_seed(0)
    return LM(*SIZES[SIZE])


def shard(model: LM, mesh: Any) -> None:
    """FSDP2 on `mesh`: every block, then the root."""
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s tokens and targets for step `step`."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=generator)
    return tokens[:, :-1], tokens[:, 1:].flatten()


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, rank: int,
               step: int) -> None:
    """Step `step` of rank `rank` (the gradients zeroed after it)."""
    tokens, target = batch(rank, step)
    F.cross_entropy(model(tokens), target).backward()
    optimizer.step()
    optimizer.zero_grad()


def local_bytes(tensors: Any) -> int:
    """Bytes of this rank's part of the tensors in a nested state (a DTensor's local shard)."""
    if isinstance(tensors, torch.Tensor):
        local = tensors.to_local() if hasattr(tensors, "to_local") else tensors
        return local.numel() * local.element_size()
    if isinstance(tensors, dict):
        return sum(local_bytes(v) for v in tensors.values())
    if isinstance(tensors, (list, tuple)):
        return sum(local_bytes(v) for v in tensors)
    return 0
