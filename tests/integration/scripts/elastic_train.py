"""Elastic training script for integration tests: injects faults, logs what it did.

Every process appends JSON lines to $LOG_DIR/<pid>.jsonl:
  {"event": "round", ...}   after each sync: round, rank, size, pid, host, step, params hash
  {"event": "step", ...}    after each successful commit: epoch, step, this rank's indices, hash
  {"event": "final", ...}   at the end: step, hash
Faults (env): FAULT_STEP, FAULT_RANK, FAULT_MODE (exception|sigkill|exit),
FAULT_MARKER (file created when the fault fires, so it fires once per job).
Rank 0 writes its committed step to $PROGRESS_FILE for discovery scripts to read.
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
from torch.utils.data import DataLoader, TensorDataset

import elasticrun.torch as er

EPOCHS = int(os.environ.get("TRAIN_EPOCHS", "3"))
SAMPLES = int(os.environ.get("TRAIN_SAMPLES", "64"))
BATCH = int(os.environ.get("TRAIN_BATCH", "4"))
STEP_SLEEP = float(os.environ.get("TRAIN_STEP_SLEEP", "0"))
LOG_DIR = os.environ["LOG_DIR"]
PROGRESS_FILE = os.environ.get("PROGRESS_FILE")
LOG_PATH = os.path.join(LOG_DIR, f"{os.getpid()}.jsonl")


def log(event: str, **fields: object) -> None:
    record = {"event": event, "pid": os.getpid(), "host": os.environ.get("ELASTICRUN_HOSTNAME"),
              **fields}
    with open(LOG_PATH, "a") as file:
        file.write(json.dumps(record) + "\n")


def params_hash(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def maybe_fault(step: int) -> None:
    if str(step) != os.environ.get("FAULT_STEP") or str(er.rank()) != os.environ.get("FAULT_RANK"):
        return
    marker = os.environ.get("FAULT_MARKER")
    if marker:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return
    mode = os.environ.get("FAULT_MODE", "exception")
    log("fault", step=step, mode=mode, rank=er.rank())
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "exit":
        os._exit(3)
    raise ValueError(f"injected fault at step {step}")


def main() -> None:
    er.init()
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(7)
    data = torch.randn(SAMPLES, 8, generator=generator)
    target = (data.sum(dim=1) > 0).long()
    dataset = TensorDataset(torch.arange(SAMPLES), data, target)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = er.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                        named_parameters=model.named_parameters())
    sampler = er.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
    state = er.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, step=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(er.size())])

    @er.elastic.run
    def train(state: er.elastic.TorchState) -> None:
        from elasticrun.torch import runtime

        log("round", round=runtime.current().round, rank=er.rank(), size=er.size(),
            step=state.step, epoch=state.epoch, hash=params_hash(model),
            lr=optimizer.param_groups[0]["lr"], resets=len(resets))
        loader = DataLoader(dataset, batch_size=BATCH, sampler=state.sampler)
        while state.epoch < EPOCHS:
            for batch_idx, (indices, x, y) in enumerate(loader):
                maybe_fault(state.step + 1)
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                state.sampler.record_batch(batch_idx, BATCH)
                state.step += 1
                state.commit()
                log("step", round=runtime.current().round, rank=er.rank(), size=er.size(),
                    epoch=state.epoch, step=state.step, indices=indices.tolist(),
                    hash=params_hash(model))
                if PROGRESS_FILE and er.rank() == 0:
                    with open(PROGRESS_FILE + ".tmp", "w") as file:
                        file.write(str(state.step))
                    os.replace(PROGRESS_FILE + ".tmp", PROGRESS_FILE)
                if STEP_SLEEP:
                    time.sleep(STEP_SLEEP)
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    log("final", rank=er.rank(), size=er.size(), step=state.step, hash=params_hash(model))
    print(f"finished rank {er.rank()} of {er.size()} at step {state.step}", flush=True)
    er.shutdown()
    sys.exit(0)


if __name__ == "__main__":
    main()
