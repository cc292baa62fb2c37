"""Elastic HSDP training for integration tests (--shard-size): FSDP2 inside each replica
group on `er.shard_mesh()`, elasticrun across the groups (`er.replicate`), SGD with momentum
so that a replay in one process compares exactly.

Step s's data are `batch(s, size)`: BATCH rows per rank of the round, rank r taking rows
r*BATCH.. of them, so that one process replays a step from its number and world size.
Every process appends JSON lines to $LOG_DIR/<pid>.jsonl:
  {"event": "start"}                             before er.init()
  {"event": "round", ...}  after each sync: round, rank, size, shard/replica rank, step,
                           the sha of this rank's local shards (model, optimizer) and of the
                           full parameters of its replica group (gathered in the group)
  {"event": "step", ...}   after each commit: step, size
  {"event": "restore", ...} when it rolls back to the last commit (step)
At the end rank 0 writes the full model and momentum to $LOG_DIR/final.pt.
HSDP_FAULTS="STEP:RANK:MODE,..." (MODE sigkill|sigstop|exception|twice) fires once per job at
the start of step STEP on the worker that is then rank RANK (RANK "*": on every rank, once
for each); "twice" raises there twice, so
that the ranks roll back to the same commit two times. HSDP_STEPS: how many steps (default
12); HSDP_STEP_SLEEP: seconds slept after each commit; HSDP_AWAIT_SIZE=N: before its last
steps the job waits (at most 2 minutes) for its world to reach N (a returning group).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F

import elasticrun.torch as er

LOG_DIR = os.environ.get("LOG_DIR", ".")
STEPS = int(os.environ.get("HSDP_STEPS", "12"))
STEP_SLEEP = float(os.environ.get("HSDP_STEP_SLEEP", "0"))
AWAIT_SIZE = int(os.environ.get("HSDP_AWAIT_SIZE", "0"))
BATCH = 4
LR = 0.05


def log(event: str, **fields: object) -> None:
    record = {"event": event, "pid": os.getpid(), "time": time.time(), **fields}
    with open(os.path.join(LOG_DIR, f"{os.getpid()}.jsonl"), "a") as file:
        file.write(json.dumps(record) + "\n")


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    return (torch.randn(BATCH * size, 8, generator=generator),
            torch.randn(BATCH * size, 3, generator=generator))


def digest(tensors: list[torch.Tensor]) -> str:
    sha = hashlib.sha256()
    for tensor in tensors:
        sha.update(tensor.detach().contiguous().numpy().tobytes())
    return sha.hexdigest()[:16]


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def maybe_fault(step: int) -> None:
    for spec in filter(None, os.environ.get("HSDP_FAULTS", "").split(",")):
        fault_step, fault_rank, mode = spec.split(":")
        if int(fault_step) != step or fault_rank not in ("*", str(er.rank())):
            continue
        for attempt in range(2 if mode == "twice" else 1):
            marker = os.path.join(LOG_DIR, f"fault-{spec}-{attempt}-{er.rank()}")
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                continue
            log("fault", step=step, mode=mode, rank=er.rank())
            if mode == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "sigstop":
                os.kill(os.getpid(), signal.SIGSTOP)
                return
            if mode == "twice":  # as a failed collective does: a rollback, not an error
                raise er.HorovodInternalError(f"injected failure at step {step}")
            raise ValueError(f"injected fault at step {step}")


def main() -> None:
    from torch.distributed.fsdp import fully_shard

    log("start")
    er.init()
    model = make_model()
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=er.shard_mesh())
    fully_shard(model, mesh=er.shard_mesh())
    er.replicate(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)

    class LoggedState(er.elastic.TorchState):
        def restore(self) -> None:
            log("restore", step=self.step)
            super().restore()

    state = LoggedState(model, optimizer, step=0)

    def describe() -> None:
        momenta = [local(s["momentum_buffer"]) for s in optimizer.state_dict()["state"].values()
                   if s.get("momentum_buffer") is not None]
        full = [p.full_tensor() for p in model.parameters()]
        log("round", rank=er.rank(), size=er.size(), shard_rank=er.shard_rank(),
            replica_rank=er.replica_rank(), replicas=er.num_replicas(), step=state.step,
            shard=digest([local(p) for p in model.parameters()]), momentum=digest(momenta),
            full=digest(full))

    @er.elastic.run
    def train(state: er.elastic.TorchState) -> None:
        describe()
        while state.step < STEPS:
            if AWAIT_SIZE and state.step == STEPS - 2:
                for _ in range(600):
                    if er.size() >= AWAIT_SIZE:
                        break
                    time.sleep(0.2)
                    state.check_host_updates()
            maybe_fault(state.step + 1)
            x, y = batch(state.step + 1, er.size())
            rows = slice(er.rank() * BATCH, (er.rank() + 1) * BATCH)
            optimizer.zero_grad()
            F.mse_loss(model(x[rows]), y[rows]).backward()
            optimizer.step()
            state.step += 1
            try:
                state.commit()
            except er.elastic.HostsUpdatedInterrupt:
                # the commit is made; the interrupt follows it (a new worker joins now)
                log("step", step=state.step, size=er.size(), rank=er.rank())
                raise
            log("step", step=state.step, size=er.size(), rank=er.rank())
            if STEP_SLEEP:
                time.sleep(STEP_SLEEP)

    train(state)
    full = {name: p.full_tensor() for name, p in model.named_parameters()}
    momenta = {}
    for param, name in zip(model.parameters(), full, strict=True):
        buffer = optimizer.state.get(param, {}).get("momentum_buffer")
        if buffer is not None:
            momenta[name] = buffer.full_tensor()
    if er.rank() == 0:
        torch.save({"params": full, "momenta": momenta, "step": state.step},
                   os.path.join(LOG_DIR, "final.pt"))
    log("final", rank=er.rank(), size=er.size(), step=state.step)
    sys.exit(0)


if __name__ == "__main__":
    main()
