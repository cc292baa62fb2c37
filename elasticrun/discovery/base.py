"""The HostDiscovery protocol every discovery source implements."""

from __future__ import annotations

from typing import Protocol

# Ordered: the order hosts are listed in is the order they are first given ranks.
HostSlots = dict[str, int]


class HostDiscovery(Protocol):
    """Finds the hosts a job may use right now.

    `find_hosts` returns {host: slots} in a stable order, and raises
    `elasticrun.job.errors.DiscoveryError` with a one-line reason when it cannot tell.
    """

    async def find_hosts(self) -> HostSlots: ...

    def describe(self) -> str: ...
