"""The pool's record of each worker process it started, and the environment it gets."""

from __future__ import annotations

import asyncio
import itertools
import re
import secrets
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from elasticrun import protocol
from elasticrun.driver.processes.output import attempt_directory, new_tail
from elasticrun.driver.rounds.assignment import SlotId
from elasticrun.job.config import TorchrunSettings
from elasticrun.launch.base import WorkerProcess
from elasticrun.protocol import SlotInfo

_serial = itertools.count(1)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")  # what a run id may not bring into a file name
# torchrun's default for workers that share a host: one intra-op thread each, unless the
# user says otherwise (N workers of a thread per core each would overload the host's cores).
INTRA_OP_THREADS = "OMP_NUM_THREADS"


def new_worker_id(slot: SlotId) -> str:
    """Unique per spawned process, so a respawn in the same slot is a different worker."""
    return f"{slot.host}/{slot.index}/{next(_serial)}-{secrets.token_hex(4)}"


@dataclass
class WorkerProcessRecord:
    """A process the pool started: its handle, its exit, the last lines of its stderr."""

    id: str
    slot: SlotId
    process: WorkerProcess
    attempt: int = 0  # its round's restart count when it started (TORCHELASTIC_RESTART_COUNT)
    exit_code: int | None = None
    stderr_tail: deque[str] = field(default_factory=new_tail)
    watcher: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        return self.exit_code is None


@dataclass(frozen=True)
class EnvSettings:
    rendezvous_addr: str
    rendezvous_port: int
    secret: str
    collective_timeout: float
    round_timeout: float
    driver_timeout: float
    gloo_interface: str | None
    backend: str = "auto"
    elastic: bool = True  # the membership may change (process sets are refused then)
    hang_detection: bool = True  # workers report stalled collectives
    stragglers: str = "report"  # off: workers send no pace reports
    run_id: str = "none"  # TORCHELASTIC_RUN_ID
    max_restarts: int = 0  # TORCHELASTIC_MAX_RESTARTS
    torchrun: TorchrunSettings = field(default_factory=TorchrunSettings)
    error_dir: Path = Path("/tmp")  # where @record's error files go (TORCHELASTIC_ERROR_FILE)
    snapshot_dir: Path | None = None  # each host's snapshots of commits (None: off)
    checkpoint_dir: Path | None = None  # --checkpoint-dir
    checkpoint_interval: float = 60.0
    shard_size: int = 1  # --shard-size


@dataclass(frozen=True)
class Placed:
    """Where one worker starts: its slot in its round, its host's place among the round's
    hosts (torchrun's group), and the round's count of restarts so far."""

    info: SlotInfo
    round: int = 0
    group_rank: int = 0
    group_size: int = 1
    restarts: int = 0
    restore: bool = False  # it replaces workers that were all lost: its round restores


def job_env(
    settings: EnvSettings,
    worker_id: str,
    placed: Placed,
    master_addr: str,
    master_port: int,
    inherited: Mapping[str, str],
) -> dict[str, str]:
    """What elasticrun sets for one worker: its place, in elasticrun, torchrun and Horovod
    names, and how to reach the driver. The secret travels in the environment, never on a
    command line. Like torchrun, one intra-op thread per worker where a host runs several
    and OMP_NUM_THREADS is not set."""
    info = placed.info
    env = {
        protocol.ENV_HOSTNAME: info.hostname,
        protocol.ENV_RANK: str(info.rank),
        protocol.ENV_SIZE: str(info.size),
        protocol.ENV_LOCAL_RANK: str(info.local_rank),
        protocol.ENV_LOCAL_SIZE: str(info.local_size),
        protocol.ENV_CROSS_RANK: str(info.cross_rank),
        protocol.ENV_CROSS_SIZE: str(info.cross_size),
        protocol.ENV_RENDEZVOUS_ADDR: settings.rendezvous_addr,
        protocol.ENV_RENDEZVOUS_PORT: str(settings.rendezvous_port),
        protocol.ENV_WORKER_ID: worker_id,
        protocol.ENV_SECRET: settings.secret,
        protocol.ENV_ROUND: str(placed.round),
        protocol.ENV_COLLECTIVE_TIMEOUT: f"{settings.collective_timeout:g}",
        protocol.ENV_ROUND_TIMEOUT: f"{settings.round_timeout:g}",
        protocol.ENV_DRIVER_TIMEOUT: f"{settings.driver_timeout:g}",
        protocol.ENV_BACKEND: settings.backend,
        protocol.ENV_ELASTIC: "1" if settings.elastic else "0",
        protocol.ENV_HANG_DETECTION: "1" if settings.hang_detection else "0",
        protocol.ENV_STRAGGLERS: settings.stragglers,
        protocol.ENV_SNAPSHOT_DIR: str(settings.snapshot_dir or ""),
        protocol.ENV_CHECKPOINT_DIR: str(settings.checkpoint_dir or ""),
        protocol.ENV_CHECKPOINT_INTERVAL: f"{settings.checkpoint_interval:g}",
        protocol.ENV_SHARD_SIZE: str(settings.shard_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "PYTHONUNBUFFERED": "1",
    }
    if placed.restore:
        env[protocol.ENV_RESTORE] = "1"
    env.update(torchrun_env(settings, placed))
    env.update(horovod_env(info))
    if settings.gloo_interface and "GLOO_SOCKET_IFNAME" not in inherited:
        env["GLOO_SOCKET_IFNAME"] = settings.gloo_interface
    if info.local_size > 1 and INTRA_OP_THREADS not in inherited:
        env[INTRA_OP_THREADS] = "1"
    return env


def torchrun_env(settings: EnvSettings, placed: Placed) -> dict[str, str]:
    """What torchrun's agent gives each worker (torch/distributed/elastic/agent/server/
    local_elastic_agent.py), but MASTER_ADDR/PORT: rank 0's host and a port of its own per
    round, where rank 0's TCPStore runs (the agent's store is not shared: there is none)."""
    info, torchrun = placed.info, settings.torchrun
    env = {
        "RANK": str(info.rank),
        "WORLD_SIZE": str(info.size),
        "LOCAL_RANK": str(info.local_rank),
        "LOCAL_WORLD_SIZE": str(info.local_size),
        "GROUP_RANK": str(placed.group_rank),
        "GROUP_WORLD_SIZE": str(placed.group_size),
        "ROLE_RANK": str(info.rank),
        "ROLE_WORLD_SIZE": str(info.size),
        "ROLE_NAME": torchrun.role,
        "TORCHELASTIC_RESTART_COUNT": str(placed.restarts),
        "TORCHELASTIC_MAX_RESTARTS": str(settings.max_restarts),
        "TORCHELASTIC_RUN_ID": settings.run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": str(error_file(settings, placed)),
    }
    if torchrun.virtual_local_rank:
        env["LOCAL_RANK"] = "0"
        env["CUDA_VISIBLE_DEVICES"] = str(info.local_rank)
    return env


def error_file(settings: EnvSettings, placed: Placed) -> Path:
    """Where torchrun's @record writes a worker's uncaught exception: under --log-dir, in
    torchrun's layout (`attempt_<K>/<local rank>/error.json` of the run's directory); else
    one file per run, attempt and rank in the temporary directory. The worker's foothold
    makes its directory on its host if need be, reads the file when the script fails, and
    tells the driver."""
    torchrun = settings.torchrun
    if torchrun.log_dir is not None:
        node = placed.info.hostname if torchrun.nodes_of is not None else None
        return attempt_directory(settings.error_dir, node, placed.restarts,
                                 placed.info.local_rank) / "error.json"
    run = _UNSAFE.sub("_", settings.run_id)
    return settings.error_dir / (f"torchelastic-error-{run}-attempt{placed.restarts}"
                                 f"-rank{placed.info.rank}.json")


def horovod_env(info: SlotInfo) -> dict[str, str]:
    """The variables horovodrun gives an elastic worker (horovod/runner/gloo_run.py)."""
    place = {"HOSTNAME": info.hostname, "RANK": info.rank, "SIZE": info.size,
             "LOCAL_RANK": info.local_rank, "LOCAL_SIZE": info.local_size,
             "CROSS_RANK": info.cross_rank, "CROSS_SIZE": info.cross_size}
    env = {protocol.HOROVOD_ENV_PREFIX + name: str(value) for name, value in place.items()}
    env[protocol.HOROVOD_ELASTIC] = "1"
    return env
