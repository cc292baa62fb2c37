"""`--discovery agents`: the hosts are those whose `elasticrun agent` is connected now.

An agent that connects is a host added; one that goes away is a host removed (and, if its
workers were running, failed: launch/agents/hub.py). The driver's watcher is woken at each
change, so a new agent is seen at once rather than at the next poll.
"""

from __future__ import annotations

from typing import Protocol

from elasticrun.discovery.base import HostSlots
from elasticrun.discovery.plugins import DiscoveryOptions
from elasticrun.job.errors import ConfigError


class ConnectedAgents(Protocol):
    """What the driver's AgentHub tells: the connected agents' hosts and slots."""

    def hosts(self) -> HostSlots: ...


class AgentsDiscovery:
    def __init__(self, hub: ConnectedAgents) -> None:
        self._hub = hub

    async def find_hosts(self) -> HostSlots:
        return self._hub.hosts()

    def describe(self) -> str:
        return "connected agents"


def plugin(options: DiscoveryOptions) -> AgentsDiscovery:
    if options.arg:
        raise ConfigError(f"agents discovery takes no argument, got {options.arg!r}")
    if options.agents is None:
        raise ConfigError("agents discovery needs the job's agent token: "
                          "--agent-token-file FILE or ELASTICRUN_AGENT_TOKEN")
    return AgentsDiscovery(options.agents)
