"""run()'s arguments read into a job's settings: the frozen DriverConfig, the workers' added
environment and the log level.

The arguments mirror the CLI's flags and build the same DriverConfig
(job_config.build_config); Horovod's names for them are folded in, its options that mean
nothing here refused, and every bad argument raises one ConfigError line naming it, in
run()'s names rather than the CLI's flags.

Importing this module stays light, as api/run.py's import must (it imports this one):
job_config is imported only when the settings are built.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticrun.job.config import DriverConfig
from elasticrun.job.errors import ConfigError

WORKER_MODULE = "elasticrun.torch.run_func"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# Horovod's names (horovod.run) and the CLI's for settings run() names otherwise.
ALIASES = {"num_proc": "np", "min_num_proc": "min_np", "max_num_proc": "max_np",
           "host_discovery_script": "discovery", "slots_per_host": "slots",
           "cooldown_range": "blacklist_cooldown_range"}
# A ConfigError from the shared config code names CLI flags; run()'s caller wrote arguments.
_FLAG = re.compile(r"(?<![\w-])(-H/--hosts|--[a-z][a-z-]*[a-z]|-np)\b")
_FLAG_NAMES = {"-H/--hosts": "hosts", "-np": "np", "--host-discovery-script": "discovery",
               "--slots-per-host": "slots"}


@dataclass(frozen=True)
class JobSettings:
    config: DriverConfig
    env: dict[str, str]
    log_level: str


def job_settings(func: object, args: object, kwargs: object,
                 options: Mapping[str, Any]) -> JobSettings:
    """run()'s arguments -> the job's settings; a bad one raises ConfigError naming it."""
    if not callable(func):
        raise ConfigError(f"func must be callable, got {type(func).__name__}")
    if not isinstance(args, (tuple, list)):
        raise ConfigError(f"args must be a tuple or a list, got {type(args).__name__}")
    if kwargs is not None and not (isinstance(kwargs, Mapping)
                                   and all(isinstance(k, str) for k in kwargs)):
        raise ConfigError("kwargs must be a dict with string keys")
    opts = _canonical(options)
    for name in ("np", "min_np", "max_np", "slots", "shard_size"):
        _integer(opts, name, 1)
    _integer(opts, "reset_limit", 0)
    _integer(opts, "ssh_port", 1, 65535)
    _integer(opts, "port", 0, 65535)
    for name in ("discovery_interval", "discovery_timeout", "start_timeout",
                 "elastic_timeout", "collective_timeout", "driver_timeout", "hang_timeout",
                 "stuck_timeout"):
        _seconds(opts, name)
    sources = [name for name in ("hosts", "hostfile", "discovery") if opts[name] is not None]
    if len(sources) > 1:
        raise ConfigError(f"give only one of hosts, hostfile, discovery (got {', '.join(sources)})")
    command = (_text(opts, "executable") or sys.executable, "-m", WORKER_MODULE)
    from elasticrun.api.job_config import build_config  # it loads the discovery plugins

    try:
        config = build_config(
            command=command, np=opts["np"], min_np=opts["min_np"], max_np=opts["max_np"],
            shard_size=1 if opts["shard_size"] is None else opts["shard_size"],
            hosts=_hosts(opts["hosts"]), hostfile=_path(opts, "hostfile"),
            discovery_script=_path(opts, "discovery"),
            discovery_interval=opts["discovery_interval"],
            discovery_timeout=opts["discovery_timeout"], slots_per_host=opts["slots"],
            start_timeout=opts["start_timeout"], elastic_timeout=opts["elastic_timeout"],
            reset_limit=opts["reset_limit"],
            blacklist_cooldown_range=_cooldown(opts["blacklist_cooldown_range"]),
            permanent_blacklist=bool(opts["permanent_blacklist"]),
            collective_timeout=opts["collective_timeout"],
            network_interface=_text(opts, "network_interface"),
            output_filename=_path(opts, "output_filename"),
            prefix_output_with_timestamp=bool(opts["prefix_output_with_timestamp"]),
            ssh_port=opts["ssh_port"], ssh_identity_file=_path(opts, "ssh_identity_file"),
            ssh_accept_new_host_keys=bool(opts["ssh_accept_new_host_keys"]),
            remote_python=_text(opts, "remote_python"),
            working_dir=_path(opts, "working_dir"), port=opts["port"],
            driver_timeout=opts["driver_timeout"], backend=_text(opts, "backend") or "auto",
            hang_detection=bool(opts["hang_detection"]), hang_timeout=opts["hang_timeout"],
            stuck_timeout=opts["stuck_timeout"],
            stragglers=_text(opts, "stragglers") or "report",
            launcher=_text(opts, "launcher") or "auto",
            agent_token_file=_path(opts, "agent_token_file"))
    except ConfigError as exc:
        raise ConfigError(python_names(str(exc))) from None
    return JobSettings(config, _env(opts["env"]), _log_level(opts))



def python_names(message: str) -> str:
    """A message naming CLI flags (`--min-np`), in run()'s argument names (`min_np`)."""
    return _FLAG.sub(lambda m: _FLAG_NAMES.get(m[1], m[1].lstrip("-").replace("-", "_")),
                     message)


def _canonical(options: Mapping[str, Any]) -> dict[str, Any]:
    """Horovod's names folded into run()'s; its MPI options refused."""
    opts = dict(options)
    if opts.pop("use_mpi", None):
        raise ConfigError("use_mpi=True: elasticrun has no MPI; its workers talk over Gloo")
    if opts.pop("mpi_args", None) is not None:
        raise ConfigError("mpi_args: elasticrun has no MPI; its workers talk over Gloo")
    if opts.pop("use_gloo", None) is False:
        raise ConfigError("use_gloo=False: elasticrun always uses Gloo")
    opts.pop("disable_cache", None)
    interfaces = opts.pop("network_interfaces", None)
    if interfaces is not None:
        if isinstance(interfaces, str) or not isinstance(interfaces, Sequence) \
                or len(interfaces) != 1:
            raise ConfigError(f"network_interfaces: elasticrun uses one interface, expected a "
                              f"list of one name, got {interfaces!r}")
        _fold(opts, "network_interface", "network_interfaces", interfaces[0])
    for alias, name in ALIASES.items():
        value = opts.pop(alias, None)
        if value is not None:
            _fold(opts, name, alias, value)
    return opts


def _fold(opts: dict[str, Any], name: str, alias: str, value: object) -> None:
    if opts.get(name) is not None and opts[name] != value:
        raise ConfigError(f"give only one of {name} and {alias} (two names for one setting)")
    opts[name] = value


def _integer(opts: Mapping[str, Any], name: str, low: int, high: int | None = None) -> None:
    value = opts[name]
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low \
            or (high is not None and value > high):
        bounds = f"{low}..{high}" if high is not None else f"at least {low}"
        raise ConfigError(f"{name} must be an integer, {bounds}; got {value!r}")


def _seconds(opts: dict[str, Any], name: str) -> None:
    """A positive number of seconds; None (horovod.run's default) is the CLI's default."""
    value = opts[name]
    if value is None:
        opts[name] = DriverConfig.__dataclass_fields__[name].default
    elif isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")


def _text(opts: Mapping[str, Any], name: str) -> str | None:
    value = opts[name]
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _path(opts: Mapping[str, Any], name: str) -> Path | None:
    value = opts[name]
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ConfigError(f"{name} must be a path, got {value!r}")
    return Path(value)


def _hosts(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Sequence) and all(isinstance(h, str) for h in value):
        return ",".join(value)
    raise ConfigError(f"hosts must be 'host:slots,...' or a list of 'host:slots', got "
                      f"{value!r}")


def _cooldown(value: object) -> tuple[float, float] | None:
    if value is None:
        return None
    if isinstance(value, Sequence) and len(value) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return float(value[0]), float(value[1])
    raise ConfigError(f"blacklist_cooldown_range must be (MIN, MAX) in seconds, got "
                      f"{value!r}")


def _env(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"env must be a dict of strings, got {type(value).__name__}")
    for name, setting in value.items():
        if not isinstance(name, str) or not name or "=" in name \
                or not isinstance(setting, str):
            raise ConfigError(f"env: {name!r}={setting!r}: names and values must be strings "
                              f"(a name without '=')")
    return dict(value)


def _log_level(opts: Mapping[str, Any]) -> str:
    if opts["verbose"]:
        return "DEBUG"
    level = opts["log_level"]
    if not isinstance(level, str) or level.upper() not in LOG_LEVELS:
        raise ConfigError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    return level.upper()
