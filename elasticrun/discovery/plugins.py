"""Finding a discovery source by name: `--discovery NAME[:ARG]` or `module.path:factory[:ARG]`.

A plugin is a factory `factory(options: DiscoveryOptions) -> HostDiscovery`, published in the
`elasticrun.discovery` entry-point group of its package:

    [project.entry-points."elasticrun.discovery"]
    mycloud = "mycloud_discovery:make"

The built-in sources (script, static, hostfile, webhook) are registered the same way.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from elasticrun.discovery.base import HostDiscovery
from elasticrun.errors import ConfigError

ENTRY_POINT_GROUP = "elasticrun.discovery"


@dataclass(frozen=True)
class DiscoveryOptions:
    """What a plugin factory gets: the ARG of `--discovery NAME:ARG` and the job's settings."""

    arg: str | None
    slots_per_host: int
    timeout: float  # seconds one find_hosts() call may take


@dataclass(frozen=True)
class DiscoverySpec:
    target: str  # an entry-point name, or "module.path:attribute"
    arg: str | None

    @property
    def by_module(self) -> bool:
        return ":" in self.target


def parse_spec(spec: str) -> DiscoverySpec:
    """`name`, `name:ARG`, `pkg.mod:factory` or `pkg.mod:factory:ARG` (ARG may hold colons)."""
    spec = spec.strip()
    head, sep, rest = spec.partition(":")
    if not head:
        raise ConfigError(f"--discovery {spec!r}: expected NAME[:ARG] or module.path:factory[:ARG]")
    if "." in head and sep:  # module path: the factory name follows the first colon
        attribute, sep2, arg = rest.partition(":")
        if not attribute.isidentifier():
            raise ConfigError(f"--discovery {spec!r}: expected module.path:factory[:ARG], "
                              f"{attribute!r} is not a Python name")
        return DiscoverySpec(f"{head}:{attribute}", arg if sep2 else None)
    if "." in head:
        raise ConfigError(f"--discovery {spec!r}: a module path needs its factory, "
                          f"e.g. {head + ':make'!r}")
    return DiscoverySpec(head, rest if sep else None)


def available() -> list[str]:
    """Names of the installed discovery plugins."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def load_discovery(spec_text: str, options: DiscoveryOptions) -> HostDiscovery:
    """Finds and calls the factory. Raises ConfigError with one line when that fails."""
    spec = parse_spec(spec_text)
    options = DiscoveryOptions(spec.arg, options.slots_per_host, options.timeout)
    factory = _factory_from_module(spec) if spec.by_module else _factory_by_name(spec)
    try:
        discovery = factory(options)
    except ConfigError as exc:
        raise ConfigError(f"--discovery {spec_text}: {exc}") from None
    except Exception as exc:  # a plugin's own bug or refusal: one line, not a traceback
        raise ConfigError(f"--discovery {spec_text}: the plugin failed to start: "
                          f"{type(exc).__name__}: {exc}") from None
    if not callable(getattr(discovery, "find_hosts", None)):
        raise ConfigError(f"--discovery {spec_text}: the factory returned "
                          f"{type(discovery).__name__}, which has no find_hosts()")
    return discovery  # type: ignore[no-any-return]


def _factory_by_name(spec: DiscoverySpec) -> Any:
    matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == spec.target]
    if not matches:
        names = ", ".join(available()) or "none"
        raise ConfigError(f"--discovery: no discovery plugin named {spec.target!r} "
                          f"(installed: {names})")
    try:
        return matches[0].load()
    except Exception as exc:
        raise ConfigError(f"--discovery {spec.target}: cannot load {matches[0].value}: "
                          f"{type(exc).__name__}: {exc}") from None


def _factory_from_module(spec: DiscoverySpec) -> Any:
    module_name, attribute = spec.target.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(f"--discovery {spec.target}: cannot import {module_name}: "
                          f"{type(exc).__name__}: {exc}") from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise ConfigError(f"--discovery {spec.target}: {module_name} has no callable "
                          f"{attribute!r}")
    return factory
