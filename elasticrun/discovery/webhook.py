"""Hosts pushed to the driver's host-change webhook (`--discovery webhook[:HOSTS]`).

Nothing is polled: an autoscaler or scheduler PUTs the full host list, or adds and removes
hosts, through the driver's authenticated `/v1/hosts` endpoints. HOSTS, if given, is the
list to start with (`webhook:node1:4,node2:4`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from elasticrun.discovery.base import HostSlots
from elasticrun.discovery.parsing import parse_hosts_flag
from elasticrun.discovery.plugins import DiscoveryOptions
from elasticrun.job.errors import ConfigError


@runtime_checkable
class PushableDiscovery(Protocol):
    """A discovery source whose host list the webhook may set directly."""

    def set_hosts(self, hosts: HostSlots) -> None: ...

    def add_hosts(self, hosts: HostSlots) -> None: ...

    def remove_hosts(self, hosts: Iterable[str]) -> list[str]: ...


class WebhookDiscovery:
    def __init__(self, hosts: HostSlots | None = None) -> None:
        self._hosts: HostSlots = dict(hosts or {})

    async def find_hosts(self) -> HostSlots:
        return dict(self._hosts)

    def describe(self) -> str:
        return "host-change webhook"

    def set_hosts(self, hosts: HostSlots) -> None:
        self._hosts = dict(hosts)

    def add_hosts(self, hosts: HostSlots) -> None:
        """New hosts go last (they get the highest ranks); a known host takes the new slots."""
        self._hosts.update(hosts)

    def remove_hosts(self, hosts: Iterable[str]) -> list[str]:
        return [host for host in hosts if self._hosts.pop(host, None) is not None]


def plugin(options: DiscoveryOptions) -> WebhookDiscovery:
    if not options.arg:
        return WebhookDiscovery()
    try:
        return WebhookDiscovery(parse_hosts_flag(options.arg, options.slots_per_host))
    except ValueError as exc:
        raise ConfigError(f"initial hosts: {exc}") from None
