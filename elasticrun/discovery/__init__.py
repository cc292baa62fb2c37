"""Host discovery: where the job may run, as an ordered {host: slots} mapping."""

from elasticrun.discovery.base import HostDiscovery, HostSlots
from elasticrun.discovery.hostfile import HostfileDiscovery
from elasticrun.discovery.script import ScriptDiscovery
from elasticrun.discovery.static import StaticDiscovery

__all__ = ["HostDiscovery", "HostSlots", "HostfileDiscovery", "ScriptDiscovery", "StaticDiscovery"]
