"""The driver's record of each worker process it started, and the environment it gets."""

from __future__ import annotations

import asyncio
import enum
import itertools
import os
import secrets
import signal
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from elasticrun import protocol
from elasticrun.driver.assignment import SlotId
from elasticrun.driver.output import new_tail
from elasticrun.protocol import SlotInfo
from elasticrun.spawn.base import WorkerProcess


class WorkerState(enum.Enum):
    RUNNING = "running"      # alive and holding its slot
    RELEASED = "released"    # has no place any more; its exit is neither success nor failure
    STOPPING = "stopping"    # the driver is stopping it
    FINISHED = "finished"    # exited 0 as a member of the current round
    FAILED = "failed"        # exited non-zero on its own


_serial = itertools.count(1)


def new_worker_id(slot: SlotId) -> str:
    """Unique per spawned process, so a respawn in the same slot is a different worker."""
    return f"{slot.host}/{slot.index}/{next(_serial)}-{secrets.token_hex(4)}"


@dataclass
class Worker:
    id: str
    slot: SlotId
    rank: int
    process: WorkerProcess | None = None
    state: WorkerState = WorkerState.RUNNING
    exit_code: int | None = None
    joined_round: int = 0  # the last round it joined; 0: none yet (it is starting up)
    synced_round: int = 0  # the last round whose committed state it holds; 0: none
    stderr_tail: deque[str] = field(default_factory=new_tail)
    watcher: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        return self.exit_code is None


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


@dataclass(frozen=True)
class EnvSettings:
    rendezvous_addr: str
    rendezvous_port: int
    secret: str
    collective_timeout: float
    round_timeout: float
    driver_timeout: float
    gloo_interface: str | None


def worker_env(
    base: Mapping[str, str],
    settings: EnvSettings,
    worker_id: str,
    info: SlotInfo,
    master_addr: str,
    master_port: int,
) -> dict[str, str]:
    """The launcher's environment plus the worker's place, in elasticrun and torchrun names.

    The secret travels in the environment, never on a command line. The operator's
    secrets (webhook token, event key) stay with the driver: a worker cannot change hosts.
    """
    env = dict(base)
    for name in [n for n in env if n.startswith("TORCHELASTIC_")]:
        del env[name]
    env.pop(protocol.ENV_WEBHOOK_TOKEN, None)
    env.pop(protocol.ENV_EVENT_SECRET, None)
    env.update({
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
        protocol.ENV_COLLECTIVE_TIMEOUT: f"{settings.collective_timeout:g}",
        protocol.ENV_ROUND_TIMEOUT: f"{settings.round_timeout:g}",
        protocol.ENV_DRIVER_TIMEOUT: f"{settings.driver_timeout:g}",
        "RANK": str(info.rank),
        "WORLD_SIZE": str(info.size),
        "LOCAL_RANK": str(info.local_rank),
        "LOCAL_WORLD_SIZE": str(info.local_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "PYTHONUNBUFFERED": "1",
    })
    if settings.gloo_interface and "GLOO_SOCKET_IFNAME" not in base:
        env["GLOO_SOCKET_IFNAME"] = settings.gloo_interface
    return env


def launcher_env() -> dict[str, str]:
    return dict(os.environ)
