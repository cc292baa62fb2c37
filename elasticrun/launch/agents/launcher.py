"""The `agent` launcher: workers start on a host through the `elasticrun agent` connected for
it (launch/agents/hub.py). A worker's environment is what elasticrun sets for it, sealed with
the agent token, on top of the agent's own environment: a pod's or a Slurm step's
environment stays its own, and the driver's never travels."""

from __future__ import annotations

from elasticrun.job.errors import ConfigError, SpawnError
from elasticrun.launch.agents import wire
from elasticrun.launch.agents.hub import AgentHub
from elasticrun.launch.agents.process import AgentProcess
from elasticrun.launch.base import WorkerSpec
from elasticrun.launch.local.forked import READY_TIMEOUT_S
from elasticrun.launch.plugins import LaunchOptions, no_arg
from elasticrun.system.timed import within

# How long an agent may take to say it started a worker: its host's first one waits for the
# host's worker template to import torch (up to READY_TIMEOUT_S on a loaded host; then the
# worker is exec'd instead), and the start itself.
START_ACK_S = READY_TIMEOUT_S + 15.0


class NoAgent(SpawnError):
    """No agent connected for the worker's host in time."""


class AgentLauncher:
    def __init__(self, hub: AgentHub, connect_timeout: float) -> None:
        self._hub = hub
        self._connect_timeout = connect_timeout

    async def start(self, spec: WorkerSpec) -> AgentProcess:
        link = await self._hub.wait_for(spec.host, self._connect_timeout)
        if link is None:
            raise NoAgent(f"no elasticrun agent connected for host {spec.host} within "
                          f"{self._connect_timeout:g}s")
        if link.draining:
            raise SpawnError(f"the agent for host {spec.host} is draining")
        process = AgentProcess(spec.worker_id, link.send)
        link.processes[spec.worker_id] = process
        await link.send(wire.Start(spec.worker_id, spec.command, str(spec.cwd),
                                   wire.seal(self._hub.token, spec.worker_id, spec.job_env)))
        try:
            error = await within(process.started, START_ACK_S)
        except TimeoutError:
            link.processes.pop(spec.worker_id, None)
            await link.send(wire.Stop(spec.worker_id, 0.0))  # in case it starts after all
            process.lost()
            raise SpawnError(f"the agent for host {spec.host} did not start the worker "
                             f"within {START_ACK_S:g}s") from None
        if error is not None:
            raise SpawnError(f"host {spec.host}: {error}")
        return process

    def outlives_driver(self, host: str) -> bool:
        """An agent keeps its workers while the driver is away (within its grace)."""
        return True

    def driver_address(self, host: str) -> str | None:
        """The address the host's agent dialed: it reaches the driver, so its workers do."""
        link = self._hub.link(host)
        return link.local if link is not None else None

    def host_address(self, host: str) -> str | None:
        """Where the host is, as the driver sees its agent's connection come from: the
        other hosts reach it there too (MASTER_ADDR when its worker is rank 0)."""
        link = self._hub.link(host)
        return link.remote if link is not None and link.remote != "?" else None

    async def close(self) -> None:
        return None  # the hub, the driver's, tells the agents the job is over


def plugin(options: LaunchOptions) -> AgentLauncher:
    no_arg(options, "agent")
    if options.agents is None:
        raise ConfigError("the agent launcher needs the job's agent token: "
                          "--agent-token-file FILE or ELASTICRUN_AGENT_TOKEN")
    # Hosts from the agents are connected by definition; those from another source (Slurm,
    # a script) may take a moment to have theirs: as long as a worker may take to check in.
    return AgentLauncher(options.agents, options.config.start_timeout)
