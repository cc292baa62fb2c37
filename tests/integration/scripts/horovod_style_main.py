"""An elastic training script written the way Horovod's elastic integration tests write
theirs, with only the import changed: it reads Horovod's worker environment
(HOROVOD_HOSTNAME, HOROVOD_RANK = the rank this process started with) and waits for the
driver's host-change notice through `state._host_messages`, as Horovod's State keeps it.

Rank 0 appends one JSON line per epoch to --logfile; a discovery script counts those lines
to know the epoch, and lists the hosts the schedule gives for it.
--exit-schedule '{"(EPOCH, BATCH)": [START_RANK, ...]}' makes those workers fail there
(--exit-mode exception | kill).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import torch
import torch.nn.functional as F

import elasticrun.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--batches-per-epoch", type=int, default=10)
parser.add_argument("--batches-per-commit", type=int, default=1)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--epoch-wait", type=float, default=0.0)
parser.add_argument("--logfile", required=True)
parser.add_argument("--discovery-schedule", default="[]")
parser.add_argument("--discovery-wait", type=float, default=3.0)
parser.add_argument("--exit-schedule", default="{}")
parser.add_argument("--exit-mode", default="exception", choices=["exception", "kill"])
args = parser.parse_args()

hvd.init()

inputs = torch.randn(32, 2)
labels = torch.randint(0, 2, (32,))
base_lr = 0.001
model = torch.nn.Sequential(torch.nn.Linear(2, 2))
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=base_lr * hvd.size()),
    named_parameters=model.named_parameters())

hostname = os.environ.get("HOROVOD_HOSTNAME")
start_rank = int(os.environ.get("HOROVOD_RANK", 0))

schedule = json.loads(args.discovery_schedule)
hosts_by_epoch = {epoch: hosts for epoch, hosts in schedule if epoch is not None}
later_hosts = schedule[-1][1] if schedule else []
exits = json.loads(args.exit_schedule)


def maybe_exit(epoch: int, batch: int) -> None:
    if start_rank not in exits.get(str((epoch, batch)), []):
        return
    if args.exit_mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"scheduled exit at epoch {epoch} batch {batch}, start rank "
                       f"{start_rank}, rank {hvd.rank()}")


def log_epoch(state: hvd.elastic.TorchState) -> None:
    record = {"epoch": state.epoch, "batch": state.batch, "commits": state.commits,
              "hostname": hostname, "start_rank": start_rank, "rank": hvd.rank(),
              "size": hvd.size(), "rendezvous": state.rendezvous}
    with open(args.logfile, "a") as file:
        file.write(json.dumps(record) + "\n")


def wait_for_notice(state: hvd.elastic.TorchState) -> None:
    """Horovod's way: forget the last update's time, then poll the notice queue."""
    state._last_updated_timestamp = 0
    started = time.time()
    while state._host_messages.empty():
        if time.time() - started > args.discovery_wait:
            raise TimeoutError("no host-change notice from the driver")
        time.sleep(0.1)


@hvd.elastic.run
def train(state: hvd.elastic.TorchState) -> None:
    state.rendezvous += 1
    while state.epoch < args.epochs:
        while state.batch < args.batches_per_epoch:
            maybe_exit(state.epoch, state.batch)
            optimizer.zero_grad()
            F.cross_entropy(model(inputs), labels).backward()
            optimizer.step()
            state.batch += 1
            if state.batch % args.batches_per_commit == 0:
                state.commits += 1
                state.commit()
        if hvd.rank() == 0:
            log_epoch(state)
            now = hosts_by_epoch.get(state.epoch, later_hosts)
            upcoming = hosts_by_epoch.get(state.epoch + 1, later_hosts)
            if args.discovery_wait > 0 and now != upcoming:
                wait_for_notice(state)
        if args.epoch_wait > 0:
            time.sleep(args.epoch_wait)
        state.epoch += 1
        state.batch = 0
        state.commits += 1
        state.commit()


def rescale_lr() -> None:
    for group in optimizer.param_groups:
        group["lr"] = base_lr * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, batch=0, epoch=0, commits=0, rendezvous=0)
state.register_reset_callbacks([rescale_lr])
train(state)
