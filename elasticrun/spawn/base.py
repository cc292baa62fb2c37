"""The Spawner protocol: start a worker command somewhere, stream its output, stop it."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol


class WorkerProcess(Protocol):
    """A running worker. Output arrives as bytes on the two readers."""

    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader

    async def wait(self) -> int:
        """The exit code; -N when killed by signal N."""
        ...

    async def stop(self, grace_period: float) -> None:
        """SIGTERM to the whole process tree, SIGKILL after the grace period."""
        ...


class Spawner(Protocol):
    async def spawn(
        self, host: str, command: Sequence[str], env: Mapping[str, str], cwd: Path
    ) -> WorkerProcess: ...


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
