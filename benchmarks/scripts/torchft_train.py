"""The peer of er_ft_train.py: the same model and data under torchft, as its train_ddp.py
example sets it up — one replica group of one worker, a Manager talking to the Lighthouse
at TORCHFT_LIGHTHOUSE, a reconfigurable ProcessGroupGloo, torchft's Optimizer wrapper.
Runs in the benchmark's side venv (torchft installed).

Env (besides model.py's, kit.py's and failure.py's): REPLICA_GROUP_ID, NUM_REPLICA_GROUPS,
TORCHFT_LIGHTHOUSE, BENCH_MIN_REPLICAS, BENCH_PG_TIMEOUT_S, BENCH_MANAGER_TIMEOUT_S,
BENCH_TORCHFT_PATH ("allreduce": one Manager.allreduce of all gradients; "ddp":
torchft.DistributedDataParallel), BENCH_BARRIER_DIR (every group waits there for the
others before its first step, so that the first quorum holds all of them).
Events: "started", "imported" (model, Manager and its TCPStore built), "step" (committed;
with the quorum's size), "failure" (a step whose commit was refused: the survivors' lost
attempt), the failure's own event, "done".
"""

from __future__ import annotations

import time

STARTED = time.time()
# ruff: noqa: E402  (the imports come after STARTED: a benchmark times them)

from datetime import timedelta

import kit
import torch
import torch.nn.functional as F
import torchft
from failure import FAIL_RANK, FAIL_STEP, fail
from kit import emit
from model import STEPS, batch, build_model
from torch.distributed import TCPStore

REPLICA = kit.env_int("REPLICA_GROUP_ID")
REPLICAS = kit.env_int("NUM_REPLICA_GROUPS")
MIN_REPLICAS = kit.env_int("BENCH_MIN_REPLICAS")
PG_TIMEOUT = timedelta(seconds=kit.env_float("BENCH_PG_TIMEOUT_S"))
MANAGER_TIMEOUT = timedelta(seconds=kit.env_float("BENCH_MANAGER_TIMEOUT_S"))
BARRIER = kit.env_path("BENCH_BARRIER_DIR")
WRAPPER = kit.env_str("BENCH_TORCHFT_PATH", "allreduce") == "ddp"


def allreduce_gradients(manager: torchft.Manager, model: torch.nn.Module) -> None:
    """One averaging allreduce of all gradients through the Manager, which turns an error
    into a refused commit (what DDP's one bucket does)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    manager.allreduce(flat).wait()
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def main() -> None:
    emit("started", at=STARTED)
    model = build_model()
    # What torchrun would host for a replica group (MASTER_ADDR:MASTER_PORT): with one
    # worker per group, the worker hosts it itself.
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    pg = torchft.ProcessGroupGloo(timeout=PG_TIMEOUT)
    sgd = torch.optim.SGD(model.parameters(), lr=0.01)
    load_state_dict, state_dict = kit.state_callbacks(model, sgd)
    manager = torchft.Manager(pg=pg, min_replica_size=MIN_REPLICAS,
                              load_state_dict=load_state_dict, state_dict=state_dict,
                              replica_id=f"bench_{REPLICA}", timeout=MANAGER_TIMEOUT,
                              store_addr="127.0.0.1", store_port=store.port, rank=0,
                              world_size=1, hostname="127.0.0.1")
    forward = torchft.DistributedDataParallel(manager, model) if WRAPPER else model
    optimizer = torchft.Optimizer(manager, sgd)
    emit("imported")
    data, target = batch(REPLICA)
    kit.file_barrier(BARRIER, str(REPLICA), REPLICAS)  # the first quorum holds every group
    while manager.current_step() < STEPS:
        step = manager.current_step()
        optimizer.zero_grad()  # starts this step's quorum
        loss = F.cross_entropy(forward(data), target)
        if step == FAIL_STEP and REPLICA == FAIL_RANK:
            # The failure comes once the step's quorum holds this group, as in the
            # elasticrun job: the survivors meet it in the gradient allreduce.
            manager.wait_quorum()
            fail(REPLICA, step)
        loss.backward()
        if not WRAPPER:
            allreduce_gradients(manager, model)
        optimizer.step()  # commits (steps the optimizer) only if every replica succeeded
        if manager.current_step() > step:
            emit("step", rank=REPLICA, size=manager.num_participants(),
                 step=manager.current_step())
        else:
            emit("failure", rank=REPLICA, step=step)
    emit("done", rank=REPLICA, params=kit.parameter_count(model))
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
