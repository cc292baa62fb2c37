"""Finding a launcher by name: `--launcher NAME[:ARG]` or `module.path:factory[:ARG]`.

A launcher plugin is a factory `factory(options: LaunchOptions) -> Launcher`, published in
the `elasticrun.launchers` entry-point group of its package:

    [project.entry-points."elasticrun.launchers"]
    mycluster = "mycluster_launcher:make"

The built-in launchers (auto, local, ssh, slurm, agent) are registered the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elasticrun.job import plugins
from elasticrun.job.config import DriverConfig
from elasticrun.job.errors import ConfigError
from elasticrun.launch.base import Launcher

ENTRY_POINT_GROUP = "elasticrun.launchers"
FLAG = "--launcher"
DEFAULT = "auto"


@dataclass(frozen=True)
class LaunchOptions:
    """What a launcher factory gets: the ARG of `--launcher NAME:ARG`, the job's settings,
    and the job's AgentHub (None unless the job uses agents)."""

    arg: str | None
    config: DriverConfig
    agents: Any = None


def available() -> list[str]:
    return plugins.available(ENTRY_POINT_GROUP)


def launcher_name(spec_text: str) -> str:
    """The target a --launcher value names (an entry-point name or module:factory)."""
    return plugins.parse_spec(FLAG, spec_text).target


def load_launcher(spec_text: str, config: DriverConfig, agents: Any = None) -> Launcher:
    spec = plugins.parse_spec(FLAG, spec_text)
    factory = plugins.find_factory(FLAG, ENTRY_POINT_GROUP, "launcher", spec)
    launcher = plugins.call_factory(FLAG, spec_text, factory,
                                    LaunchOptions(spec.arg, config, agents))
    for method in ("start", "close"):
        if not callable(getattr(launcher, method, None)):
            raise ConfigError(f"{FLAG} {spec_text}: the factory returned "
                              f"{type(launcher).__name__}, which has no {method}()")
    return launcher  # type: ignore[no-any-return]


def no_arg(options: LaunchOptions, name: str) -> None:
    """For launchers that take no ARG."""
    if options.arg:
        raise ConfigError(f"the {name} launcher takes no argument, got {options.arg!r}")
