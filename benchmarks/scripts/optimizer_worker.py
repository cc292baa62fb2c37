"""Training steps of many-layer models, timed: elasticrun's DistributedOptimizer variants
under elasticrun, or plain DDP under torchrun (BENCH_VARIANTS=ddp).

Env: kit.py's BENCH_OUT (JSON-lines file of events), BENCH_SPEC (JSON: per model its sizes, see
`build_model`; "warmup" and "steps" per variant, and "round_steps": the variants take
turns, that many steps each), BENCH_VARIANTS (comma-separated: "hooks"
DistributedOptimizer(overlap=True), "nohooks" (overlap=False), "fp16" (Compression.fp16,
overlap=True), "ddp_here" (plain DDP on the elasticrun round's Gloo group, in the same job:
a reference that shares every condition with the others); or "ddp" alone, once per copy
of the model to train in turns, under torchrun).
elasticrun's variants commit a TorchState every BENCH_SPEC["commit_every"] of their steps,
inside the timed step, as an elastic training script does; "every_step" is "hooks"
committing at every step (host snapshots on, as by default).
Events (rank 0): "measured" per model and variant, with the measured steps' durations (and
their forward+backward and step() parts) and, for elasticrun, the allreduces of one more
step (dtype and element count of each); "done".
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from kit import append_json, close_process_group, parameter_count
from model import mlp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import elasticrun.torch as er
from elasticrun.torch.collectives import shared_sum

SPEC: dict[str, Any] = json.loads(os.environ.get("BENCH_SPEC", "{}"))
VARIANTS = os.environ.get("BENCH_VARIANTS", "hooks,nohooks,fp16").split(",")
MODELS = ("transformer", "convnet", "mlp")
VOCAB = 1000
CLASSES = 10

Batch = tuple[torch.Tensor, torch.Tensor]


def emit(event: str, **fields: object) -> None:
    append_json({"event": event, "time": time.time(), **fields})  # no pid or host


class TokenClassifier(nn.Module):
    """A small encoder-only transformer predicting a class per token."""

    def __init__(self, layers: int, d_model: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens))).flatten(0, 1)


def conv_net(widths: list[int]) -> nn.Module:
    """conv3x3-BatchNorm-ReLU per width; the resolution halves where the width grows."""
    layers: list[nn.Module] = []
    previous = 3
    for width in widths:
        stride = 2 if previous not in (3, width) else 1
        layers += [nn.Conv2d(previous, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
                   nn.ReLU(inplace=True)]
        previous = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(previous, CLASSES))


def build_model(name: str, spec: dict[str, Any]) -> nn.Module:
    torch.manual_seed(0)
    if name == "transformer":
        return TokenClassifier(spec["layers"], spec["d_model"], spec["heads"])
    if name == "mlp":
        return mlp(spec["params"], spec["in_features"])  # overhead's model
    return conv_net(spec["widths"])


def make_batch(name: str, spec: dict[str, Any], rank: int) -> Batch:
    generator = torch.Generator().manual_seed(rank)
    if name == "mlp":
        return (torch.randn(spec["batch"], spec["in_features"], generator=generator),
                torch.randint(0, CLASSES, (spec["batch"],), generator=generator))
    if name == "transformer":
        shape = (spec["batch"], spec["seq"])
        return (torch.randint(0, VOCAB, shape, generator=generator),
                torch.randint(0, VOCAB, (shape[0] * shape[1],), generator=generator))
    return (torch.randn(spec["batch"], 3, spec["image"], spec["image"], generator=generator),
            torch.randint(0, CLASSES, (spec["batch"],), generator=generator))


def elasticrun_optimizer(variant: str, model: nn.Module) -> torch.optim.Optimizer:
    compression = er.Compression.fp16 if variant == "fp16" else er.Compression.none
    return er.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(),
                                   compression=compression, overlap=variant != "nohooks")


@dataclass
class Trainer:
    """One variant training one model (its own copy), and the durations of its steps."""

    variant: str
    model: nn.Module  # what is called: DDP's wrapper for "ddp"
    optimizer: torch.optim.Optimizer
    batch: Batch
    params: int
    state: er.elastic.TorchState | None = None  # committed every SPEC["commit_every"] steps
    backward_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    done: int = 0

    def train(self, steps: int, record: bool = True) -> None:
        every = 1 if self.variant == "every_step" else SPEC.get("commit_every", 0)
        for _ in range(steps):
            started = time.perf_counter()
            self.optimizer.zero_grad()
            F.cross_entropy(self.model(self.batch[0]), self.batch[1]).backward()
            backward_done = time.perf_counter()
            self.optimizer.step()
            self.done += 1
            if self.state is not None and every and self.done % every == 0:
                self.state.commit()  # (its time counts in step())
            if record:
                self.backward_s.append(backward_done - started)
                self.step_s.append(time.perf_counter() - backward_done)


def make_trainer(name: str, variant: str, rank: int) -> Trainer:
    spec = SPEC[name]
    model = build_model(name, spec)
    params = parameter_count(model)
    batch = make_batch(name, spec, rank)
    if variant in ("ddp", "ddp_here"):
        group = er.process_group_for("cpu") if variant == "ddp_here" else None
        return Trainer(variant, DistributedDataParallel(model, process_group=group),
                       torch.optim.SGD(model.parameters(), lr=0.01), batch, params)
    optimizer = elasticrun_optimizer(variant, model)
    return Trainer(variant, model, optimizer, batch, params,
                   er.elastic.TorchState(model, optimizer))


@contextmanager
def counted_allreduces() -> Iterator[list[dict[str, Any]]]:
    """Records the dtype and element count of every torch.distributed.all_reduce issued in
    the block (elasticrun calls it through the module, so the wrapper sees each one), and of
    every bucket summed in shared memory instead."""
    calls: list[dict[str, Any]] = []
    original, original_shared = dist.all_reduce, shared_sum.SharedBuckets.start

    def record(tensor: torch.Tensor) -> None:
        calls.append({"dtype": str(tensor.dtype).removeprefix("torch."),
                      "numel": tensor.numel(), "bytes": tensor.numel() * tensor.element_size()})

    def counting(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        record(tensor)
        return original(tensor, *args, **kwargs)

    def counting_shared(self: shared_sum.SharedBuckets, index: int) -> shared_sum.SharedSum:
        record(self.buffers[index].data)
        return original_shared(self, index)

    dist.all_reduce = counting
    shared_sum.SharedBuckets.start = counting_shared  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        dist.all_reduce = original
        shared_sum.SharedBuckets.start = original_shared  # type: ignore[method-assign]


def measure(name: str, rank: int, barrier: Callable[[], None]) -> list[dict[str, Any]]:
    """Every variant on its own copy of the model, interleaved: ROUND_STEPS steps of each in
    turn (the first variant rotating), so that load from outside hits all alike."""
    trainers = [make_trainer(name, variant, rank) for variant in VARIANTS]
    allreduces: dict[str, list[dict[str, Any]]] = {}
    for trainer in trainers:
        trainer.train(SPEC["warmup"], record=False)
        # an extra, untimed step: the counting wrapper costs nothing timed
        if not trainer.variant.startswith("ddp"):
            with counted_allreduces() as allreduces[trainer.variant]:
                trainer.train(1, record=False)
    barrier()
    per_round = SPEC.get("round_steps", SPEC["steps"])
    for index in range(-(-SPEC["steps"] // per_round)):
        shift = index % len(trainers)
        for trainer in trainers[shift:] + trainers[:shift]:
            trainer.train(min(per_round, SPEC["steps"] - len(trainer.step_s)))
    return [{"variant": t.variant, "params": t.params, "batch": len(t.batch[0]),
             "backward_s": t.backward_s, "step_s": t.step_s,
             "total_s": [b + s for b, s in zip(t.backward_s, t.step_s, strict=True)],
             "allreduces": allreduces.get(t.variant, [])} for t in trainers]


def run_all(rank: int, world: int, barrier: Callable[[], None]) -> None:
    for name in MODELS:
        if name not in SPEC:
            continue
        for result in measure(name, rank, barrier):
            if rank == 0:
                emit("measured", model=name, world=world, **result)
        gc.collect()  # this model's copies, optimizers and hooks


def main_elasticrun() -> None:
    er.init()
    run_all(er.rank(), er.size(), er.barrier)
    if er.rank() == 0:
        emit("done")
    er.shutdown()


def main_ddp() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    run_all(rank, dist.get_world_size(), dist.barrier)
    if rank == 0:
        emit("done")
    close_process_group()


if __name__ == "__main__":
    main_ddp() if set(VARIANTS) == {"ddp"} else main_elasticrun()
