"""A fixed host list (-H/--hosts, or localhost:<np> when nothing is given)."""

from __future__ import annotations

from elasticrun.discovery.base import HostSlots
from elasticrun.discovery.parsing import parse_hosts_flag
from elasticrun.discovery.plugins import DiscoveryOptions
from elasticrun.job.errors import ConfigError


class StaticDiscovery:
    def __init__(self, hosts: HostSlots) -> None:
        self._hosts = dict(hosts)

    async def find_hosts(self) -> HostSlots:
        return dict(self._hosts)

    def describe(self) -> str:
        return "static host list"


def plugin(options: DiscoveryOptions) -> StaticDiscovery:
    """`--discovery static:node1:4,node2:4`."""
    if not options.arg:
        raise ConfigError("expected static:HOST:SLOTS[,HOST:SLOTS...]")
    try:
        return StaticDiscovery(parse_hosts_flag(options.arg, options.slots_per_host))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
