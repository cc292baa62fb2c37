"""Finding a discovery source by name: `--discovery NAME[:ARG]` or `module.path:factory[:ARG]`.

A plugin is a factory `factory(options: DiscoveryOptions) -> HostDiscovery`, published in the
`elasticrun.discovery` entry-point group of its package:

    [project.entry-points."elasticrun.discovery"]
    mycloud = "mycloud_discovery:make"

The built-in sources (script, static, hostfile, webhook, slurm, agents) are registered the
same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from elasticrun.discovery.base import HostDiscovery
from elasticrun.job import plugins
from elasticrun.job.errors import ConfigError
from elasticrun.job.plugins import PluginSpec

ENTRY_POINT_GROUP = "elasticrun.discovery"
FLAG = "--discovery"
DiscoverySpec = PluginSpec


@dataclass(frozen=True)
class DiscoveryOptions:
    """What a plugin factory gets: the ARG of `--discovery NAME:ARG` and the job's settings."""

    arg: str | None
    slots_per_host: int
    timeout: float  # seconds one find_hosts() call may take
    agents: Any = None  # the job's AgentHub, for `--discovery agents` (None: no agents)


def parse_spec(spec: str) -> DiscoverySpec:
    """`name`, `name:ARG`, `pkg.mod:factory` or `pkg.mod:factory:ARG` (ARG may hold colons)."""
    return plugins.parse_spec(FLAG, spec)


def available() -> list[str]:
    """Names of the installed discovery plugins."""
    return plugins.available(ENTRY_POINT_GROUP)


def load_discovery(spec_text: str, options: DiscoveryOptions) -> HostDiscovery:
    """Finds and calls the factory. Raises ConfigError with one line when that fails."""
    spec = parse_spec(spec_text)
    factory = plugins.find_factory(FLAG, ENTRY_POINT_GROUP, "discovery plugin", spec)
    discovery = plugins.call_factory(FLAG, spec_text, factory, replace(options, arg=spec.arg))
    if not callable(getattr(discovery, "find_hosts", None)):
        raise ConfigError(f"--discovery {spec_text}: the factory returned "
                          f"{type(discovery).__name__}, which has no find_hosts()")
    return discovery  # type: ignore[no-any-return]
