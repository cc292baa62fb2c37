"""Finding a plugin factory by name: `--FLAG NAME[:ARG]` or `--FLAG module.path:factory[:ARG]`.

Discovery sources (`--discovery`) and launchers (`--launcher`) are both plugins: a factory
published in an entry-point group of its package, or named by its module path. The
built-in ones are registered the same way. Every failure is one ConfigError line naming
the flag and the spec.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from elasticrun.job.errors import ConfigError


@dataclass(frozen=True)
class PluginSpec:
    target: str  # an entry-point name, or "module.path:attribute"
    arg: str | None

    @property
    def by_module(self) -> bool:
        return ":" in self.target


def parse_spec(flag: str, spec: str) -> PluginSpec:
    """`name`, `name:ARG`, `pkg.mod:factory` or `pkg.mod:factory:ARG` (ARG may hold colons)."""
    spec = spec.strip()
    head, sep, rest = spec.partition(":")
    if not head:
        raise ConfigError(f"{flag} {spec!r}: expected NAME[:ARG] or module.path:factory[:ARG]")
    if "." in head and sep:  # module path: the factory name follows the first colon
        attribute, sep2, arg = rest.partition(":")
        if not attribute.isidentifier():
            raise ConfigError(f"{flag} {spec!r}: expected module.path:factory[:ARG], "
                              f"{attribute!r} is not a Python name")
        return PluginSpec(f"{head}:{attribute}", arg if sep2 else None)
    if "." in head:
        raise ConfigError(f"{flag} {spec!r}: a module path needs its factory, "
                          f"e.g. {head + ':make'!r}")
    return PluginSpec(head, rest if sep else None)


def available(group: str) -> list[str]:
    """Names of the plugins installed in an entry-point group."""
    return sorted({ep.name for ep in entry_points(group=group)})


def find_factory(flag: str, group: str, kind: str, spec: PluginSpec) -> Any:
    """The factory a spec names; `kind` ("discovery plugin", "launcher") is for messages."""
    if spec.by_module:
        return _factory_from_module(flag, spec)
    matches = [ep for ep in entry_points(group=group) if ep.name == spec.target]
    if not matches:
        names = ", ".join(available(group)) or "none"
        raise ConfigError(f"{flag}: no {kind} named {spec.target!r} (installed: {names})")
    try:
        return matches[0].load()
    except Exception as exc:
        raise ConfigError(f"{flag} {spec.target}: cannot load {matches[0].value}: "
                          f"{type(exc).__name__}: {exc}") from None


def call_factory(flag: str, spec_text: str, factory: Any, options: Any) -> Any:
    """`factory(options)`; a plugin's refusal or own bug becomes one ConfigError line."""
    try:
        return factory(options)
    except ConfigError as exc:
        raise ConfigError(f"{flag} {spec_text}: {exc}") from None
    except Exception as exc:
        raise ConfigError(f"{flag} {spec_text}: the plugin failed to start: "
                          f"{type(exc).__name__}: {exc}") from None


def _factory_from_module(flag: str, spec: PluginSpec) -> Any:
    module_name, attribute = spec.target.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(f"{flag} {spec.target}: cannot import {module_name}: "
                          f"{type(exc).__name__}: {exc}") from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise ConfigError(f"{flag} {spec.target}: {module_name} has no callable "
                          f"{attribute!r}")
    return factory
