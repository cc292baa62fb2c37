"""Elastic HSDP: a small transformer language model, FSDP2 inside replica groups, elasticrun
across them.

    elasticrun -np 4 -H 127.0.0.1:2,127.0.0.2:2 --shard-size 2 \
        python examples/hsdp_transformer.py

Two replica groups of 2 ranks, one per host (127.0.0.x are separate hosts, run locally).
Inside a group each block and the root are `fully_shard`ed on `er.shard_mesh()`, so each
rank holds half of the parameters and of AdamW's state; `er.replicate(model)` has elasticrun
average the gradients across the groups. Add `--min-np 2` and a SIGKILLed worker takes its
host's group out: the other group rolls back to the last commit and goes on alone (with
`--blacklist-cooldown-range 1 2` the host comes back and its new workers receive their
shards from the live group). The data are synthetic tokens: next-token prediction of a
sequence whose every token is a fixed function of the one before.
Flags: --steps, --commit-every, --log-every, --hidden, --layers (or HSDP_EXAMPLE_STEPS etc.);
--step-sleep slows each step down (seconds), to leave time to kill a worker by hand.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset

import elasticrun.torch as er

VOCAB = 512
SEQ = 32


class Block(nn.Module):
    """Pre-norm self-attention (causal) and an MLP, each with a residual."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden)
        self.attn = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(),
                                 nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, hidden: int, layers: int, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, hidden)
        self.position = nn.Parameter(torch.zeros(SEQ, hidden))
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).flatten(0, 1))  # (batch * SEQ, VOCAB) logits


def make_dataset(samples: int) -> TensorDataset:
    """Sequences where token t+1 = (3 * token t + 7) mod VOCAB, from random first tokens."""
    generator = torch.Generator().manual_seed(42)
    tokens = torch.empty(samples, SEQ + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, VOCAB, (samples,), generator=generator)
    for t in range(SEQ):
        tokens[:, t + 1] = (3 * tokens[:, t] + 7) % VOCAB
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def local_numel(model: nn.Module) -> int:
    """Elements of this rank's shards (a DTensor's local part)."""
    return sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
               for p in model.parameters())


def env_default(name: str, default: float) -> float:
    return float(os.environ.get(f"HSDP_EXAMPLE_{name.upper()}", default))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=int(env_default("steps", 60)))
    parser.add_argument("--commit-every", type=int, default=int(env_default("commit_every", 5)))
    parser.add_argument("--log-every", type=int, default=int(env_default("log_every", 10)))
    parser.add_argument("--hidden", type=int, default=int(env_default("hidden", 256)))
    parser.add_argument("--layers", type=int, default=int(env_default("layers", 4)))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--step-sleep", type=float, default=env_default("step_sleep", 0))
    args = parser.parse_args()

    er.init()
    torch.manual_seed(0)  # the same initial model in every replica group
    model = TinyLM(args.hidden, args.layers)
    full_numel = sum(p.numel() for p in model.parameters())
    for block in model.blocks:
        fully_shard(block, mesh=er.shard_mesh())
    fully_shard(model, mesh=er.shard_mesh())
    er.replicate(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    if er.rank() == 0:
        print(f"model: {full_numel:,} parameters; this rank's shard: {local_numel(model):,} "
              f"(shards of {er.shard_size()} ranks)", flush=True)

    dataset = make_dataset(args.steps * args.batch_size * er.size())
    sampler = er.elastic.ElasticSampler(dataset, shuffle=True)
    state = er.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, step=0)

    @er.elastic.run
    def train(state: er.elastic.TorchState) -> None:
        if er.rank() == 0:
            print(f"round: from step {state.step}, {er.size()} ranks: {er.num_replicas()} "
                  f"replica group(s) of {er.shard_size()}", flush=True)
        started, since = time.perf_counter(), state.step
        while state.step < args.steps:
            loader = DataLoader(dataset, batch_size=args.batch_size, sampler=state.sampler)
            for batch_idx, (tokens, target) in enumerate(loader):
                loss = F.cross_entropy(model(tokens), target.flatten())
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                state.sampler.record_batch(batch_idx, args.batch_size)
                state.step += 1
                if args.step_sleep:
                    time.sleep(args.step_sleep)
                if er.rank() == 0 and state.step % args.log_every == 0:
                    rate = (state.step - since) / (time.perf_counter() - started)
                    print(f"step {state.step:4d}  loss {loss.item():.4f}  ranks {er.size()}  "
                          f"{rate:.1f} steps/s", flush=True)
                if state.step % args.commit_every == 0:
                    state.commit()
                if state.step >= args.steps:
                    break
            else:
                state.epoch += 1
                state.sampler.set_epoch(state.epoch)
                state.commit()

    train(state)
    if er.rank() == 0:
        print(f"done: {state.step} steps, {er.size()} ranks at the end", flush=True)
    er.shutdown()


if __name__ == "__main__":
    main()
