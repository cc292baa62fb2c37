"""The Launcher protocol: start one worker on a host, stream its output, report its exit,
stop it. Nothing else in the driver knows which launcher is in use."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from elasticrun import protocol


class WorkerProcess(Protocol):
    """A running worker. Output arrives as bytes on the two readers."""

    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader

    async def wait(self) -> int:
        """The exit code: -N (local) or 128+N (remote) when killed by signal N; 255 when the
        way to the worker was lost before its exit was known."""
        ...

    async def stop(self, grace_period: float) -> None:
        """SIGTERM to the worker's whole process tree, SIGKILL after the grace period.
        Returns within the grace period and a few seconds more."""
        ...

    # Optional: `async inspect() -> ProcessView`, what the worker's process is doing as its
    # host sees it (stopped, running, gone), asked when the worker may be hung. A launcher
    # without it leaves hung workers to --hang-timeout.
    # Optional: `host_lost: bool`, true once it ended because the way to its host went (an
    # agent's connection, an SSH connection): it did not fail on its own (its 255 is no exit
    # code of its own), and its host is failed, not only its slot.


@dataclass(frozen=True)
class WorkerSpec:
    """One worker to start: where, what, and its environment in two parts."""

    worker_id: str
    host: str
    command: tuple[str, ...]
    cwd: Path
    # What elasticrun sets for this worker: its place, the driver's address, the job secret.
    job_env: Mapping[str, str]
    # The environment elasticrun was started in (the operator's own secrets removed). A
    # launcher whose hosts have environments of their own (agent) starts workers in those.
    launcher_env: Mapping[str, str]

    @property
    def env(self) -> dict[str, str]:
        return {**self.launcher_env, **self.job_env}


class Launcher(Protocol):
    """Starts and stops workers on hosts.

    `start` raises `elasticrun.job.errors.SpawnError` (one line) when the worker cannot be
    started, and returns within a bound of its own. A launcher may also define
    `driver_address(host) -> str | None`: the driver's address as workers on `host` dial it
    (None, or no such method: the address that routes to the host); `outlives_driver(host)
    -> bool`: whether its workers on `host` go on when the driver is killed, for a resumed
    driver to take back (no such method: they end with it); `serving(port)`: told the
    driver's port once it listens.
    """

    async def start(self, spec: WorkerSpec) -> WorkerProcess: ...

    async def close(self) -> None:
        """The job is over: release connections. Workers still running are stopped."""
        ...


def local_names() -> set[str]:
    """Names and addresses by which this machine refers to itself."""
    names = {"localhost", "localhost.localdomain", "ip6-localhost", "::1"}
    for name in (socket.gethostname(), socket.getfqdn()):
        names.add(name)
        names.add(name.split(".")[0])
    try:
        names.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return names


def is_local_host(host: str, names: set[str] | None = None) -> bool:
    """localhost, any loopback address, and this machine's own names run as subprocesses."""
    if host.startswith("127.") or host == "::1":
        return True
    return host in (names if names is not None else local_names())


def launcher_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment elasticrun runs in, as workers inherit it: without torchrun's agent
    variables (they would mislead torch) and without the operator's secrets (webhook token,
    event key): a worker cannot change hosts."""
    env = dict(os.environ if base is None else base)
    for name in [n for n in env if n.startswith("TORCHELASTIC_")]:
        del env[name]
    env.pop(protocol.ENV_WEBHOOK_TOKEN, None)
    env.pop(protocol.ENV_EVENT_SECRET, None)
    env.pop(protocol.ENV_AGENT_TOKEN, None)
    return env
