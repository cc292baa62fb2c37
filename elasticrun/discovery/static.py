"""A fixed host list (-H/--hosts, or localhost:<np> when nothing is given)."""

from __future__ import annotations

from elasticrun.discovery.base import HostSlots


class StaticDiscovery:
    def __init__(self, hosts: HostSlots) -> None:
        self._hosts = dict(hosts)

    async def find_hosts(self) -> HostSlots:
        return dict(self._hosts)

    def describe(self) -> str:
        return "static host list"
