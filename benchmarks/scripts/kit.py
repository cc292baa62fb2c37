"""What the benchmark worker scripts share besides their models: settings read from the
environment, the event log their benchmark reads, step timing, the faults a benchmark
injects, a plain DDP script's disk checkpoint and torch.distributed's clean exit.

It imports neither torch nor elasticrun when imported (each function that needs one imports
it when called), so that a script can use it before its own timed `import torch`, and the
torchft scripts in their side venv can use it too.

Env: BENCH_OUT (the JSON-lines file of events; default /dev/null), BENCH_KILL_STEP /
BENCH_KILL_RANK (the step and rank at which a script kills itself; -1: never).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def env_str(name: str, default: str | None = None) -> str:
    """The value of `name`; without a default, the variable must be set."""
    return os.environ[name] if default is None else os.environ.get(name, default)


def env_int(name: str, default: int | None = None) -> int:
    return int(env_str(name, None if default is None else str(default)))


def env_float(name: str, default: float | None = None) -> float:
    return float(env_str(name, None if default is None else str(default)))


def env_path(name: str, default: str | None = None) -> Path:
    return Path(env_str(name, default))


OUT = os.environ.get("BENCH_OUT", "/dev/null")
KILL_STEP = env_int("BENCH_KILL_STEP", -1)
KILL_RANK = env_int("BENCH_KILL_RANK", -1)


def host() -> str:
    """This worker's host: ELASTICRUN_HOSTNAME, or BENCH_HOST where torchrun runs it."""
    return os.environ.get("ELASTICRUN_HOSTNAME") or os.environ.get("BENCH_HOST", "")


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# -- the event log ------------------------------------------------------------------------


def append_json(record: dict[str, Any], path: str = OUT) -> None:
    """One JSON line appended to `path`: every process of a job writes to the same file."""
    with open(path, "a") as file:
        file.write(json.dumps(record) + "\n")


def emit(event: str, **fields: object) -> None:
    """An event, stamped with the time, this process and its host (ELASTICRUN_HOSTNAME; a
    `host` field overrides it)."""
    append_json({"event": event, "time": time.time(), "pid": os.getpid(),
                 "host": os.environ.get("ELASTICRUN_HOSTNAME", ""), **fields})


def emit_join(event: str, **fields: object) -> None:
    """`event` with this worker's rank, world size, round and its last join's timings (when
    it asked, was assigned, had the group built)."""
    import elasticrun.torch as er
    from elasticrun.torch.world import runtime

    timing = runtime.current().last_join
    emit(event, rank=er.rank(), size=er.size(), round=runtime.current().round,
         asked=timing.asked, assigned=timing.assigned, built=timing.built, **fields)


# -- step timing --------------------------------------------------------------------------


def due(step: int, every: int) -> bool:
    """Whether something done every `every` steps (0: never) is done after `step`."""
    return bool(every) and step % every == 0


def timed(action: Callable[..., object], *args: Any, **kwargs: Any) -> float:
    """Seconds `action(*args, **kwargs)` took."""
    started = time.perf_counter()
    action(*args, **kwargs)
    return time.perf_counter() - started


# -- faults -------------------------------------------------------------------------------


def signal_self(event: str, signum: int = signal.SIGKILL, **fields: object) -> None:
    """Emits `event` (its time is the fault's time), then delivers `signum` to this process;
    a stopped process stays stopped until the benchmark kills it."""
    emit(event, **fields)
    os.kill(os.getpid(), signum)


def first_time(marker: Path) -> bool:
    """Whether this is the first call with `marker` in the job: it creates the file."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def anonymous_mb() -> int:
    """This process's resident anonymous memory, MiB (what the kernel frees at a kill)."""
    with open("/proc/self/status") as status:
        line = next((line for line in status if line.startswith("RssAnon:")), "RssAnon: 0 kB")
    return int(line.split()[1]) // 1024


# -- processes that meet outside torch.distributed ----------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def state_callbacks(model: torch.nn.Module, optimizer: torch.optim.Optimizer
                    ) -> tuple[Callable[[dict[str, Any]], None], Callable[[], dict[str, Any]]]:
    """A torchft Manager's load_state_dict and state_dict: the model's and optimizer's."""

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    return load_state_dict, state_dict


def file_barrier(directory: Path, name: str, count: int, timeout_s: float = 120.0) -> None:
    """Waits until `count` processes, this one as `name`, have arrived in `directory`."""
    (directory / name).touch()
    deadline = time.monotonic() + timeout_s
    while len(list(directory.iterdir())) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not all {count} processes reached the barrier in {directory}")
        time.sleep(0.01)


# -- the servers of the rendezvous benchmark ---------------------------------------------


async def report_cpu_per_line() -> None:
    """The servers' stdin protocol: for each line read, the CPU seconds this process spent
    since the last one, printed; returns when stdin closes."""
    import asyncio
    import sys

    loop = asyncio.get_running_loop()
    mark = time.process_time()
    while await loop.run_in_executor(None, sys.stdin.readline):  # "" at EOF
        now = time.process_time()
        print(now - mark, flush=True)
        mark = now


# -- a plain DDP script's checkpoint and exit ---------------------------------------------


def save_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    step: int, fsync: bool = True) -> None:
    """{"model", "optimizer", "step"} saved into a temporary file, fsynced, renamed over
    `path`; with fsync=False, as a script that does not fsync writes it: torch.save given the
    file's name."""
    import torch

    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    partial = path.with_name(f".{path.name}.partial")
    if fsync:
        with open(partial, "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
    else:
        torch.save(state, partial)
    os.replace(partial, path)


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    map_location: str | torch.device | None = None) -> int:
    """The step of save_checkpoint's file at `path`, its model's and optimizer's state loaded
    into them (0, and nothing loaded, when there is none)."""
    import torch

    if not path.exists():
        return 0
    saved = torch.load(path, map_location=map_location)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    return int(saved["step"])


def close_process_group() -> None:
    """Destroys the default group between garbage collections (drop your references to DDP
    wrappers first): without this, torch 2.13's Gloo threads can abort the process at
    interpreter exit ("terminate called without an active exception"), which torchrun takes
    for a failure."""
    import gc

    import torch.distributed as dist

    gc.collect()
    dist.destroy_process_group()
    gc.collect()
