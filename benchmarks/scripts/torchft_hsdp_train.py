"""torchft's HSDP, the peer of er_hsdp_train.py: the same model and batches, FSDP2 inside a
replica group of GROUP_SIZE ranks (its own Gloo group and DeviceMesh, through the group's
TCPStore), torchft across the groups: a Manager per rank (the group's rank 0 hosts the
group's ManagerServer, which talks to the Lighthouse at TORCHFT_LIGHTHOUSE), a reconfigurable
torchft.ProcessGroupGloo, FSDP's all-reduce hook averaging each reduce-scattered gradient
through `manager.allreduce` (an error refuses the step's commit), torchft.Optimizer over
AdamW. Runs in the benchmark's side venv (torchft installed).

Env (besides hsdp_model.py's): REPLICA_GROUP_ID, NUM_REPLICA_GROUPS, GROUP_RANK, GROUP_SIZE,
GROUP_STORE_PORT (group rank 0 hosts the store there), TORCHFT_LIGHTHOUSE, BENCH_STEPS,
BENCH_PG_TIMEOUT_S, BENCH_KILL_STEP / BENCH_KILL_RANK (the rank, global: group * GROUP_SIZE +
group rank, that SIGKILLs itself once that step's quorum holds it, before its forward),
BENCH_BARRIER_DIR (every rank waits there for the others before its first step, so that the
first quorum holds all groups).
Events: "started", "step" (committed), "failure" (a step whose commit was refused), "kill",
"done".
"""

from __future__ import annotations

import time

STARTED = time.time()

import os  # noqa: E402
import signal  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchft  # noqa: E402
from hsdp_model import batch, build_model, emit, parameter_count, shard  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import FSDPModule  # noqa: E402

GROUP = int(os.environ["REPLICA_GROUP_ID"])
GROUPS = int(os.environ["NUM_REPLICA_GROUPS"])
GROUP_RANK = int(os.environ["GROUP_RANK"])
GROUP_SIZE = int(os.environ["GROUP_SIZE"])
STORE_PORT = int(os.environ["GROUP_STORE_PORT"])
STEPS = int(os.environ.get("BENCH_STEPS", "40"))
PG_TIMEOUT = timedelta(seconds=float(os.environ.get("BENCH_PG_TIMEOUT_S", "5")))
MANAGER_TIMEOUT = timedelta(seconds=30)
KILL_STEP = int(os.environ.get("BENCH_KILL_STEP", "-1"))
KILL_RANK = int(os.environ.get("BENCH_KILL_RANK", "-1"))
BARRIER = Path(os.environ["BENCH_BARRIER_DIR"])
BARRIER_TIMEOUT_S = 120.0
RANK = GROUP * GROUP_SIZE + GROUP_RANK


def barrier() -> None:
    (BARRIER / str(RANK)).touch()
    deadline = time.monotonic() + BARRIER_TIMEOUT_S
    while len(list(BARRIER.iterdir())) < GROUPS * GROUP_SIZE:
        if time.monotonic() > deadline:
            raise TimeoutError("not every rank started")
        time.sleep(0.01)


def main() -> None:
    emit("started", at=STARTED)
    store = dist.TCPStore("127.0.0.1", STORE_PORT, GROUP_SIZE, is_master=GROUP_RANK == 0,
                          wait_for_workers=False, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=dist.PrefixStore("shard", store), rank=GROUP_RANK,
                            world_size=GROUP_SIZE)
    model = build_model()
    params = parameter_count(model)
    shard(model, init_device_mesh("cpu", (GROUP_SIZE,)))
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        adamw.load_state_dict(state["optim"])

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": adamw.state_dict()}

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
    barrier()
    while manager.current_step() < STEPS:
        step = manager.current_step()
        optimizer.zero_grad()  # starts this step's quorum
        if step == KILL_STEP and RANK == KILL_RANK:
            manager.wait_quorum()  # as in elasticrun's job: the survivors meet it mid-step
            emit("kill", rank=RANK, step=step)
            os.kill(os.getpid(), signal.SIGKILL)
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
