"""Workers that outlive a lost driver (with --state-dir): each host's workers run under an
`elasticrun agent` the driver starts for that host when the host's first worker starts,
in a session of its own — a subprocess here (launch/local/agents.py), a detached process over
SSH elsewhere (launch/ssh/agents.py).

Killed (SIGKILL, OOM), the driver takes nobody with it: the agents keep their workers
training for --driver-grace and reconnect to a driver resumed on the same port, which
takes the workers back. Ended cleanly (the job's end, Ctrl-C, SIGTERM), it tells its
agents (the hub's End), and they stop what is left and exit, as every agent does; what
has not ended within END_WAIT_S is killed.
"""

from __future__ import annotations

import asyncio
import re
import sys
from abc import ABC, abstractmethod

from elasticrun.launch.agents.hub import AgentHub
from elasticrun.launch.agents.launcher import AgentLauncher
from elasticrun.launch.agents.process import AgentProcess
from elasticrun.launch.base import WorkerSpec

END_WAIT_S = 10.0  # at the end, how long the agents get to stop their workers and exit


def file_safe(text: str) -> str:
    """`text` (a host name, a job id) as part of a file name."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)


class JobAgents(ABC):
    """Starts one agent per host on demand; the workers start through it."""

    def __init__(self, hub: AgentHub, driver_grace: float, connect_timeout: float) -> None:
        self._hub = hub
        self._agents = AgentLauncher(hub, connect_timeout)
        self._grace = driver_grace
        self._lock = asyncio.Lock()
        self._port = 0

    def serving(self, port: int) -> None:
        """The driver's port, once it listens: its agents dial it."""
        self._port = port

    async def start(self, spec: WorkerSpec) -> AgentProcess:
        async with self._lock:  # a round's workers start together: one agent for them
            if self._hub.link(spec.host) is None:
                assert self._port, "the driver serves before it starts workers"
                await self._start_agent(spec)
        return await self._agents.start(spec)

    def outlives_driver(self, host: str) -> bool:
        return True

    def driver_address(self, host: str) -> str | None:
        return self._agents.driver_address(host)

    def agent_command(self, driver: str, host: str, python: str = sys.executable) -> list[str]:
        """The agent's command line, less its token (a file or the environment)."""
        return [python, "-m", "elasticrun", "agent", "--driver", driver,
                "--host", host, "--slots", "1", "--driver-grace", f"{self._grace:g}"]

    @property
    def port(self) -> int:
        return self._port

    @abstractmethod
    async def _start_agent(self, spec: WorkerSpec) -> None:
        """Starts the agent for spec.host unless one that may still connect is running."""

    @abstractmethod
    async def close(self) -> None:
        """After the hub told the agents the job is over (or that this driver was
        superseded): they end on their own; bounded by END_WAIT_S, then killed."""
