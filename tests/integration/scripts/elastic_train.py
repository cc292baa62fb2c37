"""Elastic training script for integration tests: injects faults, logs what it did.

Every process appends JSON lines to $LOG_DIR/<pid>.jsonl:
  {"event": "round", ...}   after each sync: round, rank, size, pid, host, step, params hash
  {"event": "batch", ...}   before each step: epoch, step, this rank's indices
  {"event": "step", ...}    after each successful commit: epoch, step, this rank's indices, hash
  {"event": "final", ...}   at the end: step, hash
  {"event": "restore", ...} when it rolls back to the last commit
Faults (env): FAULTS="STEP:RANK:MODE,..." with MODE exception|sigkill|exit|sigstop (it
stops itself), pause=S (its training thread sleeps S seconds), gil=S (it holds the GIL for
about S seconds, as a long GC pause does) or hang (its training thread waits forever, a
deadlock outside collectives); each fires once per job, at the start of step STEP on the
worker that is then rank RANK (RANK "*": on every worker, once in each process; "all":
on every rank, once per job for each rank, so every worker of the round at the same step).
TRAIN_SLOW_RANK=R: rank R's steps take 3x as long as they would (after each it sleeps
twice its own work, the CPU time of the step, and its step sleep). A file
$LOG_DIR/raise-<pid> makes worker <pid> raise at its next step (and is removed).
TRAIN_IN_BUILD=R:K:MODE[,...]: the worker that is rank K of round R, while that round's
group is being built (its connections up, before the build's own collective, the backends'
vote): "stop" stops itself (SIGSTOP: its peers wait on it in the vote); "kill" dies
(SIGKILL); "lost" first waits on a collective that never completes, as when Gloo lost the
error of a send to a peer that died (only the round's abort releases it).
TRAIN_FAIL_AT_START=PLACE:N[,...]: a worker started after the job's first round on PLACE (a
host, or a slot "host[i]") exits with code 3 before er.init(), at most N times a job for
that place: a host (or a GPU) that keeps failing.
TRAIN_STOP_FILE: when it exists at the end of an epoch, training stops there.
TRAIN_AWAIT_SIZE=N: before its last epoch the job waits for its world to reach N (a
scale-up the test started), checking for host updates every 0.2 s, at most 2 minutes.
Rank 0 writes [committed step, world size] to $PROGRESS_FILE for discovery scripts.
The learning rate is BASE_LR * world size, rescaled by a reset callback.
TRAIN_DEVICE=cuda trains on this worker's GPU (tests/gpu); "round" records then carry the
round's backend and the GPU memory in use. TRAIN_NCCL_HOST_PER_WORKER=1 gives each worker
its own NCCL host identity, so that several ranks can share one GPU over NCCL's sockets.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import signal
import sys
import threading
import time
from typing import Any

STARTED = time.time()  # the process's start, before torch's import (the "start" record's "at")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import elasticrun.torch as er  # noqa: E402

EPOCHS = int(os.environ.get("TRAIN_EPOCHS", "3"))
SAMPLES = int(os.environ.get("TRAIN_SAMPLES", "64"))
BATCH = int(os.environ.get("TRAIN_BATCH", "4"))
STEP_SLEEP = float(os.environ.get("TRAIN_STEP_SLEEP", "0"))
SLOW_RANK = int(os.environ.get("TRAIN_SLOW_RANK", "-1"))
# Steps are slower while the world is smaller than this, so that a scale-up (whose new
# workers start while training goes on) arrives before the job ends.
SLOW_BELOW = int(os.environ.get("TRAIN_SLOW_BELOW", "0"))
AWAIT_SIZE = int(os.environ.get("TRAIN_AWAIT_SIZE", "0"))
AWAIT_CHECKS = 600  # 0.2 s apart; the same number on every rank (each check is collective)
BASE_LR = 0.0125
DEVICE = os.environ.get("TRAIN_DEVICE", "cpu")
if os.environ.get("TRAIN_NCCL_HOST_PER_WORKER") == "1":
    os.environ["NCCL_HOSTID"] = f"elasticrun-test-{os.getpid()}"
LOG_DIR = os.environ["LOG_DIR"]
PROGRESS_FILE = os.environ.get("PROGRESS_FILE")
STOP_FILE = os.environ.get("TRAIN_STOP_FILE")
LOG_PATH = os.path.join(LOG_DIR, f"{os.getpid()}.jsonl")


def log(event: str, **fields: object) -> None:
    record = {"event": event, "pid": os.getpid(), "host": os.environ.get("ELASTICRUN_HOSTNAME"),
              "time": time.time(), **fields}
    with open(LOG_PATH, "a") as file:
        file.write(json.dumps(record) + "\n")


def optimizer_hash(optimizer: torch.optim.Optimizer) -> str:
    """The optimizer's per-parameter state (momentum buffers), byte for byte."""
    digest = hashlib.sha256()
    state = optimizer.state_dict()["state"]
    for key in sorted(state):
        for name in sorted(state[key]):
            value = state[key][name]
            if isinstance(value, torch.Tensor):
                digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def params_hash(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def maybe_fault(step: int) -> None:
    raise_file = os.path.join(LOG_DIR, f"raise-{os.getpid()}")
    if os.path.exists(raise_file):
        os.remove(raise_file)
        log("fault", step=step, mode="exception", rank=er.rank())
        raise ValueError(f"injected exception at step {step}")
    for spec in filter(None, os.environ.get("FAULTS", "").split(",")):
        fault_step, fault_rank, mode = spec.split(":")
        if int(fault_step) != step or fault_rank not in ("*", "all", str(er.rank())):
            continue
        # Fire once per job, even if a worker is later respawned; a fault for any rank ("*")
        # once in each process, one for all ranks once for each rank.
        marker = f"fault-{spec}" + (f"-{os.getpid()}" if fault_rank == "*" else "") + \
            (f"-{er.rank()}" if fault_rank == "all" else "")
        try:
            os.close(os.open(os.path.join(LOG_DIR, marker), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue
        log("fault", step=step, mode=mode, rank=er.rank())
        if mode == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "exit":
            os._exit(3)
        if mode == "sigstop":
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        if mode == "hang":
            threading.Event().wait()
        if mode.startswith("pause="):
            time.sleep(float(mode.partition("=")[2]))
            return
        if mode.startswith("gil="):
            hold_gil(float(mode.partition("=")[2]))
            return
        raise ValueError(f"injected fault at step {step}")


def hold_gil(seconds: float) -> None:
    """One C call that keeps the GIL for `seconds`: libc's usleep through ctypes.PyDLL,
    which (unlike ctypes.CDLL) does not release the GIL around foreign calls."""
    started = time.perf_counter()
    ctypes.PyDLL(None).usleep(int(seconds * 1e6))
    log("held_gil", seconds=time.perf_counter() - started)


class LoggedState(er.elastic.TorchState):
    # Called at the end of every sync: a rank's "round" record is written as its sync ends,
    # before its report to the driver (a peer that fails right after the sync, at its
    # first step, can have this rank stopped before it would reach its training function).
    _synced: Any = None

    def restore(self) -> None:  # a rollback to the last commit (after a failure)
        log("restore", step=self.step)
        super().restore()

    def sync(self) -> None:
        super().sync()
        if self._synced is not None:
            self._synced()


def await_size(state: er.elastic.TorchState) -> None:
    """Until the world has AWAIT_SIZE workers: a scale-up arrives before the job ends, on a
    machine however loaded (HostsUpdatedInterrupt starts the round that has them)."""
    for _ in range(AWAIT_CHECKS):
        if er.size() >= AWAIT_SIZE:
            return
        time.sleep(0.2)
        state.check_host_updates()


def faults_in_build(spec: str) -> None:
    from elasticrun.torch.world import session

    faults = {(int(r), int(k)): mode for r, k, mode in
              (entry.split(":") for entry in spec.split(","))}
    vote = session.agree_on_nccl

    def faulty_vote(wants_nccl: bool, wait: Any) -> bool:
        building = wait.__self__  # the round's session (its bound wait)
        mode = faults.get((building.number, building.slot.rank))
        if mode is not None:
            log("fault", mode=f"{mode}-in-build", round=building.number,
                rank=building.slot.rank)
        if mode == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif mode == "lost":
            never = torch.futures.Future()
            wait(torch._C._distributed_c10d._create_work_from_future(never))
        return vote(wants_nccl, wait)

    session.agree_on_nccl = faulty_vote  # type: ignore[assignment]


def fail_at_start(spec: str) -> None:
    """TRAIN_FAIL_AT_START: this worker, a later one on a failing place, exits at once."""
    if os.environ.get("ELASTICRUN_ROUND", "1") == "1":
        return  # the job's first round starts well
    host = os.environ.get("ELASTICRUN_HOSTNAME", "")
    mine = {host, f"{host}[{os.environ.get('ELASTICRUN_LOCAL_RANK')}]"}
    for item in spec.split(","):
        place, _, times = item.rpartition(":")
        if place not in mine:
            continue
        for n in range(int(times)):
            try:
                os.close(os.open(os.path.join(LOG_DIR, f"fail-at-start-{place}-{n}"),
                                 os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                continue
            os._exit(3)


def main() -> None:
    if os.environ.get("TRAIN_IN_BUILD"):
        faults_in_build(os.environ["TRAIN_IN_BUILD"])
    if os.environ.get("TRAIN_FAIL_AT_START"):
        fail_at_start(os.environ["TRAIN_FAIL_AT_START"])
    log("start", at=STARTED)
    er.init()
    from elasticrun.torch.world import runtime

    device = torch.device("cpu")
    if DEVICE == "cuda":
        device = runtime.current().device or torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(7)
    data = torch.randn(SAMPLES, 8, generator=generator)
    target = (data.sum(dim=1) > 0).long()
    dataset = TensorDataset(torch.arange(SAMPLES), data, target)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 2)).to(device)
    optimizer = er.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=BASE_LR * er.size(), momentum=0.9),
        named_parameters=model.named_parameters())
    sampler = er.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
    state = LoggedState(model, optimizer, sampler=sampler, epoch=0, step=0)
    resets = []

    def rescale() -> None:
        resets.append(er.size())
        for group in optimizer.param_groups:
            group["lr"] = BASE_LR * er.size()

    state.register_reset_callbacks([rescale])

    def log_round() -> None:
        session = runtime.current().session
        gpu = {} if device.type != "cuda" else {
            "gpu_allocated": torch.cuda.memory_allocated(device),
            "gpu_used": (lambda free, total: total - free)(*torch.cuda.mem_get_info(device))}
        log("round", round=runtime.current().round, rank=er.rank(), size=er.size(),
            step=state.step, epoch=state.epoch, hash=params_hash(model),
            optimizer_hash=optimizer_hash(optimizer), lr=optimizer.param_groups[0]["lr"],
            resets=len(resets),
            backend=session.backend if session else "", **gpu)

    state._synced = log_round

    @er.elastic.run
    def train(state: er.elastic.TorchState) -> None:
        loader = DataLoader(dataset, batch_size=BATCH, sampler=state.sampler)
        while state.epoch < EPOCHS:
            if state.epoch == EPOCHS - 1:
                await_size(state)
            for batch_idx, (indices, x, y) in enumerate(loader):
                worked = time.thread_time()  # its own work: waiting for peers uses no CPU
                maybe_fault(state.step + 1)
                # What this rank feeds into the step, logged before its gradient joins the
                # allreduce: if the step is kept, every rank's gradient made it in, even from
                # a rank that died before it could log the "step" record.
                log("batch", round=runtime.current().round, rank=er.rank(), size=er.size(),
                    epoch=state.epoch, step=state.step + 1, indices=indices.tolist())
                optimizer.zero_grad()
                x, y = x.to(device), y.to(device)
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                state.sampler.record_batch(batch_idx, BATCH)
                state.step += 1
                # Logged before the commit: a step counts if the next round resumes at or
                # after it, which the "round" records tell.
                log("step", round=runtime.current().round, rank=er.rank(), size=er.size(),
                    epoch=state.epoch, step=state.step, indices=indices.tolist(),
                    hash=params_hash(model), optimizer_hash=optimizer_hash(optimizer),
                    **({} if device.type != "cuda" else
                                                {"gpu_allocated":
                                                 torch.cuda.memory_allocated(device)}))
                state.commit()
                if PROGRESS_FILE and er.rank() == 0:
                    with open(PROGRESS_FILE + ".tmp", "w") as file:
                        json.dump([state.step, er.size()], file)
                    os.replace(PROGRESS_FILE + ".tmp", PROGRESS_FILE)
                if er.size() < SLOW_BELOW:
                    time.sleep(0.2)
                elif STEP_SLEEP:
                    time.sleep(STEP_SLEEP)
                if er.rank() == SLOW_RANK:  # 3x as long, whatever its peers do
                    time.sleep(2 * (time.thread_time() - worked + STEP_SLEEP))
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()
            if STOP_FILE and er.broadcast_object(os.path.exists(STOP_FILE), root_rank=0):
                break

    train(state)
    log("final", rank=er.rank(), size=er.size(), step=state.step, epoch=state.epoch,
        hash=params_hash(model))
    print(f"finished rank {er.rank()} of {er.size()} at step {state.step}", flush=True)
    er.shutdown()
    sys.exit(0)


if __name__ == "__main__":
    main()
