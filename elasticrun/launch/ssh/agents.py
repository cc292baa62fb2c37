"""SSH hosts' workers that outlive a lost driver (with --state-dir): each remote host's
workers run under an `elasticrun agent` (launch/agents/job_agents.py) the driver starts
there over SSH, detached from the SSH channel (bootstrap.py), which dials the driver back
on the address the driver's SSH connection to that host came from (or
--network-interface's).

The agent's token travels in its environment on the channel's stdin: never on a command
line or a remote disk. Its own output goes to $TMPDIR/elasticrun-agent-JOB-HOST.log on its
host. The workers' output reaches the driver through the agent, as with any agent.
"""

from __future__ import annotations

import asyncio

from elasticrun import protocol
from elasticrun.job.config import DriverConfig
from elasticrun.job.errors import SpawnError
from elasticrun.launch.agents.hub import AgentHub
from elasticrun.launch.agents.job_agents import END_WAIT_S, JobAgents, file_safe
from elasticrun.launch.agents.launcher import NoAgent
from elasticrun.launch.agents.process import AgentProcess
from elasticrun.launch.base import Launcher, WorkerSpec
from elasticrun.launch.plugins import LaunchOptions, no_arg
from elasticrun.launch.ssh.launcher import SSHLauncher, SSHSettings
from elasticrun.system.netif import interface_address


class SSHAgents(JobAgents):
    """One detached agent per SSH host, started when the host's first worker starts."""

    def __init__(self, hub: AgentHub, config: DriverConfig,
                 settings: SSHSettings | None = None) -> None:
        super().__init__(hub, config.driver_timeout, config.start_timeout)
        self._settings = settings or SSHSettings.from_config(config)
        self._interface = config.network_interface
        self._ssh: SSHLauncher | None = None  # only jobs with SSH hosts load keys and config
        self._pids: dict[str, int] = {}  # host -> the agent this driver started there
        self._urls: dict[str, str] = {}  # host -> the driver's URL its agent dials
        self._connected: set[str] = set()  # hosts whose agent this driver heard from

    async def start(self, spec: WorkerSpec) -> AgentProcess:
        try:
            process = await super().start(spec)
            self._connected.add(spec.host)
            return process
        except NoAgent as exc:  # started, but it cannot reach the driver, or died
            raise SpawnError(f"{exc}: the agent started there over SSH dials "
                             f"{self._urls.get(spec.host, '?')}; its log on that host: "
                             f"$TMPDIR/{self._log_name(spec.host)}") from None

    async def _start_agent(self, spec: WorkerSpec) -> None:
        ssh = self._launcher()
        old = self._pids.pop(spec.host, None)
        self._connected.discard(spec.host)
        if old is not None:  # it never connected, or it is gone: one agent per host
            await ssh.kill_session(spec.host, old, 0.0)
        address = interface_address(self._interface) if self._interface else None
        if address is None:
            address = await ssh.local_address(spec.host)
        if address is None:
            raise SpawnError(f"cannot tell which address of this machine host {spec.host} "
                             f"reaches: set --network-interface")
        host_part = f"[{address}]" if ":" in address else address
        url = self._urls[spec.host] = f"http://{host_part}:{self.port}"
        command = self.agent_command(url, spec.host, self._settings.python)
        env = {**spec.launcher_env, protocol.ENV_AGENT_TOKEN: self._hub.token}
        self._pids[spec.host] = await ssh.detach(spec.host, command, env, spec.cwd,
                                                 self._log_name(spec.host))

    def _log_name(self, host: str) -> str:
        job = self._hub.job_id or "job"
        return f"elasticrun-agent-{file_safe(f'{job}-{host}')}.log"

    async def close(self) -> None:
        if self._ssh is None:
            return
        ssh = self._ssh
        # an agent that connected was told to end (the hub's End) and gets a moment;
        # one that never did has nobody to hear from, and is killed at once
        await asyncio.gather(*(ssh.kill_session(host, pid, END_WAIT_S
                                                if host in self._connected else 0.0)
                               for host, pid in self._pids.items()))
        await ssh.close()

    def _launcher(self) -> SSHLauncher:
        if self._ssh is None:
            self._ssh = SSHLauncher(self._settings)
        return self._ssh


def ssh_launcher(options: LaunchOptions) -> Launcher:
    """SSH hosts' workers: under the job's own agents when it keeps a journal (so that they
    outlive a lost driver), else on SSH channels (they end with it)."""
    if options.config.state_dir is not None and options.agents is not None:
        return SSHAgents(options.agents, options.config)
    return SSHLauncher(SSHSettings.from_config(options.config))


def plugin(options: LaunchOptions) -> Launcher:
    """`--launcher ssh`."""
    no_arg(options, "ssh")
    return ssh_launcher(options)
