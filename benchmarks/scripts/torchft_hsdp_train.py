"""torchft's HSDP, the peer of er_hsdp_train.py: the same model and batches, FSDP2 inside a
replica group of GROUP_SIZE ranks (its own Gloo group and DeviceMesh, through the group's
TCPStore), torchft across the groups: a Manager per rank (the group's rank 0 hosts the
group's ManagerServer, which talks to the Lighthouse at TORCHFT_LIGHTHOUSE), a reconfigurable
torchft.ProcessGroupGloo, FSDP's all-reduce hook averaging each reduce-scattered gradient
through `manager.allreduce` (an error refuses the step's commit), torchft.Optimizer over
AdamW. Runs in the benchmark's side venv (torchft installed).

Env (besides hsdp_model.py's and kit.py's): REPLICA_GROUP_ID, NUM_REPLICA_GROUPS,
GROUP_RANK, GROUP_SIZE, GROUP_STORE_PORT (group rank 0 hosts the store there),
TORCHFT_LIGHTHOUSE, BENCH_PG_TIMEOUT_S, BENCH_KILL_STEP / BENCH_KILL_RANK (the rank, global:
group * GROUP_SIZE + group rank, that SIGKILLs itself once that step's quorum holds it, before
its forward),
BENCH_BARRIER_DIR (every rank waits there for the others before its first step, so that the
first quorum holds all groups).
Events: "started", "step" (committed), "failure" (a step whose commit was refused), "kill",
"done".
"""

from __future__ import annotations

import time

STARTED = time.time()
# ruff: noqa: E402  (the imports come after STARTED: a benchmark times them)

from datetime import timedelta

import kit
import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchft
from hsdp_model import STEPS, batch, build_model, shard
from kit import emit
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule

GROUP = kit.env_int("REPLICA_GROUP_ID")
GROUPS = kit.env_int("NUM_REPLICA_GROUPS")
GROUP_RANK = kit.env_int("GROUP_RANK")
GROUP_SIZE = kit.env_int("GROUP_SIZE")
STORE_PORT = kit.env_int("GROUP_STORE_PORT")
PG_TIMEOUT = timedelta(seconds=kit.env_float("BENCH_PG_TIMEOUT_S", 5))
MANAGER_TIMEOUT = timedelta(seconds=30)
BARRIER = kit.env_path("BENCH_BARRIER_DIR")
RANK = GROUP * GROUP_SIZE + GROUP_RANK


def main() -> None:
    emit("started", at=STARTED)
    store = dist.TCPStore("127.0.0.1", STORE_PORT, GROUP_SIZE, is_master=GROUP_RANK == 0,
                          wait_for_workers=False, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=dist.PrefixStore("shard", store), rank=GROUP_RANK,
                            world_size=GROUP_SIZE)
    model = build_model()
    params = kit.parameter_count(model)
    shard(model, init_device_mesh("cpu", (GROUP_SIZE,)))
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-3)
    load_state_dict, state_dict = kit.state_callbacks(model, adamw)
    manager = torchft.Manager(pg=torchft.ProcessGroupGloo(timeout=PG_TIMEOUT),
                              min_replica_size=1, load_state_dict=load_state_dict,
                              state_dict=state_dict, replica_id=f"hsdp_{GROUP}",
                              timeout=MANAGER_TIMEOUT, store_addr="127.0.0.1",
                              store_port=STORE_PORT, rank=GROUP_RANK, world_size=GROUP_SIZE,
                              hostname="127.0.0.1", init_sync=False)

    def average_across_groups(gradient: torch.Tensor) -> None:
        manager.allreduce(gradient).wait()

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_all_reduce_hook(average_across_groups)
    optimizer = torchft.Optimizer(manager, adamw)
    kit.file_barrier(BARRIER, str(RANK), GROUPS * GROUP_SIZE)  # the first quorum holds all
    while manager.current_step() < STEPS:
        step = manager.current_step()
        optimizer.zero_grad()  # starts this step's quorum
        if step == kit.KILL_STEP and RANK == kit.KILL_RANK:
            manager.wait_quorum()  # as in elasticrun's job: the survivors meet it mid-step
            kit.signal_self("kill", rank=RANK, step=step)
        tokens, target = batch(RANK, step)
        F.cross_entropy(model(tokens), target).backward()
        optimizer.step()  # steps AdamW only if every group's reduction succeeded
        if manager.current_step() > step:
            emit("step", rank=RANK, group=GROUP, size=manager.num_participants(),
                 step=manager.current_step())
        else:
            emit("failure", rank=RANK, step=step)
    emit("done", rank=RANK, params=params)
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
