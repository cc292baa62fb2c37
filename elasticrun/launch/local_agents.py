"""Local workers that outlive a lost driver (with --state-dir): each local host's workers
run under an `elasticrun agent` the driver starts for that host, in a session of its own.

Killed (SIGKILL, OOM), the driver takes nobody with it: the agents keep their workers
training for the workers' --driver-timeout and reconnect to a driver resumed on the same
port, which takes the workers back. Ended cleanly (the job's end, Ctrl-C, SIGTERM), it
tells its agents, and they stop what is left and exit, as every agent does. The agents
authenticate with a token of the job's own, kept beside the journal (0600).
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import sys
from pathlib import Path

from elasticrun.errors import ConfigError
from elasticrun.launch.agent import AgentLauncher
from elasticrun.launch.agent_hub import AgentHub
from elasticrun.launch.agent_process import AgentProcess
from elasticrun.launch.base import Launcher, WorkerSpec
from elasticrun.launch.local import LocalLauncher
from elasticrun.launch.plugins import LaunchOptions, no_arg
from elasticrun.spawning import kill_session, spawn_session

TOKEN_FILE = "agent-token"
END_WAIT_S = 10.0  # at the end, how long the agents get to stop their workers and exit


def job_agent_token(state_dir: Path) -> str:
    """The token the job's local agents use, made on first use (ConfigError: one line)."""
    path = state_dir / TOKEN_FILE
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.exists():
            token = path.read_text().strip()
            if token:
                return token
        token = secrets.token_hex(32)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(token + "\n")
        return token
    except OSError as exc:
        raise ConfigError(f"--state-dir {state_dir}: cannot write there: "
                          f"{exc.strerror or exc}") from None


class LocalAgents:
    def __init__(self, hub: AgentHub, state_dir: Path, driver_grace: float,
                 connect_timeout: float) -> None:
        self._hub = hub
        self._agents = AgentLauncher(hub, connect_timeout)
        self._token_file = state_dir / TOKEN_FILE
        self._logs = state_dir
        self._grace = driver_grace
        self._started: dict[str, asyncio.subprocess.Process] = {}
        self._lock = asyncio.Lock()
        self._port = 0

    def serving(self, port: int) -> None:
        """The driver's port, once it listens: its agents dial it on loopback."""
        self._port = port

    async def start(self, spec: WorkerSpec) -> AgentProcess:
        async with self._lock:  # a round's workers start together: one agent for them
            if self._hub.link(spec.host) is None:
                started = self._started.get(spec.host)
                if started is None or started.returncode is not None:
                    self._started[spec.host] = await self._start_agent(spec.host)
        return await self._agents.start(spec)

    def outlives_driver(self, host: str) -> bool:
        return True

    def driver_address(self, host: str) -> str | None:
        return self._agents.driver_address(host)

    async def close(self) -> None:
        """After the hub told the agents the job is over (or that this driver was
        superseded): they end on their own; bounded, then their sessions are killed."""
        running = [p for p in self._started.values() if p.returncode is None]
        if not running:
            return
        _, late = await asyncio.wait([asyncio.ensure_future(p.wait()) for p in running],
                                     timeout=END_WAIT_S)
        for wait in late:
            wait.cancel()
        for proc in running:
            if proc.returncode is None:
                await kill_session(proc)

    async def _start_agent(self, host: str) -> asyncio.subprocess.Process:
        assert self._port, "the driver serves before it starts workers"
        name = re.sub(r"[^A-Za-z0-9._-]", "_", host)
        with open(self._logs / f"agent-{name}.log", "ab") as log:
            return await spawn_session(
                [sys.executable, "-m", "elasticrun", "agent", "--driver",
                 f"http://127.0.0.1:{self._port}", "--token-file", str(self._token_file),
                 "--host", host, "--slots", "1", "--driver-grace", f"{self._grace:g}"],
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log)


def local_launcher(options: LaunchOptions) -> Launcher:
    """This machine's workers: under the job's own agents when it keeps a journal (so that
    they outlive a lost driver), else plain subprocesses (they die with it)."""
    config = options.config
    if config.state_dir is not None and options.agents is not None:
        return LocalAgents(options.agents, config.state_dir, config.driver_timeout,
                           config.start_timeout)
    return LocalLauncher()


def plugin(options: LaunchOptions) -> Launcher:
    """`--launcher local`."""
    no_arg(options, "local")
    return local_launcher(options)
