"""Local workers that outlive a lost driver (with --state-dir): each local host's workers
run under an `elasticrun agent` subprocess of the job's own (launch/agents/job_agents.py).
The agents authenticate with a token of the job's own, kept beside the journal (0600).
"""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path

from elasticrun.job.errors import ConfigError
from elasticrun.job.state_dir import write_private
from elasticrun.launch.agents.hub import AgentHub
from elasticrun.launch.agents.job_agents import END_WAIT_S, JobAgents, file_safe
from elasticrun.launch.base import Launcher, WorkerSpec
from elasticrun.launch.local.launcher import LocalLauncher
from elasticrun.launch.plugins import LaunchOptions, no_arg
from elasticrun.system.spawning import kill_session, spawn_session

TOKEN_FILE = "agent-token"


def job_agent_token(state_dir: Path) -> str:
    """The token the job's local agents use, made on first use (ConfigError: one line)."""
    path = state_dir / TOKEN_FILE
    try:
        token = path.read_text().strip() if path.exists() else ""
    except OSError as exc:
        raise ConfigError(f"--state-dir {state_dir}: cannot read {TOKEN_FILE} there: "
                          f"{exc.strerror or exc}") from None
    if not token:
        token = secrets.token_hex(32)
        write_private(state_dir, TOKEN_FILE, token + "\n")
    return token


class LocalAgents(JobAgents):
    """This machine's hosts' agents, as subprocesses in sessions of their own."""

    def __init__(self, hub: AgentHub, state_dir: Path, driver_grace: float,
                 connect_timeout: float) -> None:
        super().__init__(hub, driver_grace, connect_timeout)
        self._token_file = state_dir / TOKEN_FILE
        self._logs = state_dir
        self._started: dict[str, asyncio.subprocess.Process] = {}

    async def _start_agent(self, spec: WorkerSpec) -> None:
        started = self._started.get(spec.host)
        if started is not None and started.returncode is None:
            return  # still connecting
        name = file_safe(spec.host)
        command = self.agent_command(f"http://127.0.0.1:{self.port}", spec.host)
        path = self._logs / f"agent-{name}.log"  # private, as every file of the state dir
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
            self._started[spec.host] = await spawn_session(
                [*command, "--token-file", str(self._token_file)],
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log)

    async def close(self) -> None:
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
