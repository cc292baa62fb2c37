"""Worker script: DistributedOptimizer equals one big-batch SGD step; reports its place and env.

Prints (each on its own line, on stdout unless noted):
  info {json}                    er.* values and the worker's environment
  stderr-check <rank>            on stderr, to check the stderr prefix
  secret-in-cmdline <bool>       whether the job secret appears on any process's command line
  optimizer-equivalence ok       after the one-step comparison passed
  params <rank> <sha256>         parameters after a few more steps
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch

import elasticrun.torch as er

ENV_NAMES = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "ELASTICRUN_HOSTNAME", "ELASTICRUN_RANK", "ELASTICRUN_SIZE", "ELASTICRUN_LOCAL_RANK",
    "ELASTICRUN_LOCAL_SIZE", "ELASTICRUN_CROSS_RANK", "ELASTICRUN_CROSS_SIZE",
    "ELASTICRUN_RENDEZVOUS_ADDR", "ELASTICRUN_RENDEZVOUS_PORT",
    "HOROVOD_HOSTNAME", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_ELASTIC",
    "OMP_NUM_THREADS",
)
BATCH = 5
EXTRA_STEPS = 3


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1)
    ).double()


def batch_for(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(BATCH, 4, generator=gen, dtype=torch.float64)
    y = torch.randn(BATCH, 1, generator=gen, dtype=torch.float64)
    return x, y


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(x), y)  # mean over the batch


def secret_in_cmdlines(secret: str) -> bool:
    needle = secret.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def params_hash(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    er.init()
    rank = er.rank()
    info = {
        "rank": rank, "size": er.size(), "local_rank": er.local_rank(),
        "local_size": er.local_size(), "cross_rank": er.cross_rank(),
        "cross_size": er.cross_size(), "env": {name: os.environ.get(name) for name in ENV_NAMES},
        "intra_op_threads": torch.get_num_threads(),
    }
    print("info " + json.dumps(info, sort_keys=True), flush=True)
    print(f"stderr-check {rank}", file=sys.stderr, flush=True)

    secret = os.environ.get("ELASTICRUN_SECRET", "")
    print(f"secret-in-cmdline {secret_in_cmdlines(secret) if secret else 'no-secret'}",
          flush=True)

    # Every rank starts from a different model; broadcast_parameters must make them rank 0's.
    model = make_model(seed=rank)
    optimizer = er.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                        named_parameters=model.named_parameters())
    er.broadcast_parameters(model.state_dict(), root_rank=0)
    initial = copy.deepcopy(model)

    x, y = batch_for(rank, step=0)
    optimizer.zero_grad()
    loss_of(model, x, y).backward()
    optimizer.step()

    batches = er.allgather_object((x, y))
    assert len(batches) == er.size(), len(batches)
    reference = initial
    plain = torch.optim.SGD(reference.parameters(), lr=0.1)
    plain.zero_grad()
    loss_of(reference, torch.cat([b[0] for b in batches]),
            torch.cat([b[1] for b in batches])).backward()
    plain.step()
    moved = False
    for (name, got), (_, want), (_, before) in zip(
        model.named_parameters(), reference.named_parameters(),
        make_model(seed=0).named_parameters(), strict=True,
    ):
        assert torch.allclose(got, want, rtol=0.0, atol=1e-12), (
            f"rank {rank}: {name} differs by {(got - want).abs().max().item():g}")
        moved = moved or not torch.equal(got, before)
    assert moved, "the step did not change any parameter"
    print("optimizer-equivalence ok", flush=True)

    for step in range(1, EXTRA_STEPS + 1):
        x, y = batch_for(rank, step)
        optimizer.zero_grad()
        loss_of(model, x, y).backward()
        optimizer.step()
    print(f"params {rank} {params_hash(model)}", flush=True)
    er.shutdown()
    # PyTorch's Gloo backend can abort at interpreter exit ("terminate called without an
    # active exception") when a worker thread still has to drop a finished collective; plain
    # torchrun jobs fail the same way. A moment's sleep lets it finish before Python exits.
    time.sleep(0.2)


if __name__ == "__main__":
    main()
