"""From the command line's values to a job: the frozen DriverConfig, and its parts (the
discovery source, the launcher, the agents' hub).

Every check of a value the user gave is here, and fails as one ConfigError line naming it.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from dataclasses import replace
from pathlib import Path

from elasticrun import protocol
from elasticrun.discovery import HostDiscovery, HostfileDiscovery, ScriptDiscovery, StaticDiscovery
from elasticrun.discovery.parsing import parse_hosts_flag
from elasticrun.discovery.plugins import DiscoveryOptions, load_discovery, parse_spec
from elasticrun.driver.parts import JobParts
from elasticrun.job.config import (
    AGENT_LAUNCHERS,
    DEFAULT_BLACKLIST_COOLDOWN_S,
    DEFAULT_CHECKPOINT_INTERVAL_S,
    DEFAULT_INIT_TIMEOUT_S,
    DEFAULT_MAX_RESTARTS,
    DriverConfig,
    TorchrunSettings,
)
from elasticrun.job.errors import ConfigError
from elasticrun.job.tokens import MIN_TOKEN_LENGTH, read_secret
from elasticrun.launch.agents.hub import AgentHub
from elasticrun.launch.local.agents import job_agent_token
from elasticrun.launch.plugins import DEFAULT as DEFAULT_LAUNCHER
from elasticrun.launch.plugins import launcher_name, load_launcher

# A launcher given without a host source brings its own: agents are found by connecting,
# a Slurm job's hosts are its allocation's nodes.
IMPLIED_DISCOVERY = {"agent": "agents", "slurm": "slurm"}
# With --state-dir, these run their workers under agents of the job's own (started here
# or over SSH), so that the workers outlive a lost driver.
OWN_AGENT_LAUNCHERS = ("local", "auto", "ssh")


def build_config(
    command: tuple[str, ...],
    np: int | None,
    min_np: int | None,
    max_np: int | None,
    hosts: str | None,
    hostfile: Path | None,
    discovery_script: Path | None,
    discovery_interval: float,
    discovery_timeout: float,
    slots_per_host: int | None,
    start_timeout: float,
    elastic_timeout: float,
    reset_limit: int | None,
    blacklist_cooldown_range: tuple[float, float] | None,
    collective_timeout: float,
    network_interface: str | None,
    output_filename: Path | None,
    prefix_output_with_timestamp: bool,
    ssh_port: int | None = None,
    ssh_identity_file: Path | None = None,
    ssh_accept_new_host_keys: bool = False,
    remote_python: str | None = None,
    working_dir: Path | None = None,
    discovery: str | None = None,
    port: int = 0,
    event_webhooks: tuple[str, ...] = (),
    event_log: Path | None = None,
    state_dir: Path | None = None,
    resume: bool = False,
    webhook_token_file: Path | None = None,
    event_secret_file: Path | None = None,
    driver_timeout: float = 300.0,
    hang_detection: bool = True,
    hang_timeout: float = 5.0,
    stuck_timeout: float = 30.0,
    stragglers: str = "report",
    bind: tuple[str, ...] = (),
    backend: str = "auto",
    launcher: str = DEFAULT_LAUNCHER,
    agent_token_file: Path | None = None,
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    host_snapshots: bool = True,
    checkpoint_dir: Path | None = None,
    checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL_S,
    init_timeout: float = DEFAULT_INIT_TIMEOUT_S,
    torchrun: TorchrunSettings | None = None,
    stop_grace_period: float | None = None,
    agent_token: str | None = None,  # the token itself (torchrun's form), not from a file
    shard_size: int = 1,
    permanent_blacklist: bool = False,
) -> DriverConfig:
    default_slots = slots_per_host or 1
    static_hosts = None
    if hosts is not None:
        try:
            static_hosts = tuple(parse_hosts_flag(hosts, default_slots).items())
        except ValueError as exc:
            raise ConfigError(f"-H/--hosts: {exc}") from None
    if np is None:
        if min_np is not None:
            np = min_np
        elif static_hosts is not None:
            group = max(shard_size, 1)  # (a bad --shard-size is refused by DriverConfig)
            np = sum(slots - slots % group for _, slots in static_hosts)  # whole groups
            if np == 0 and group > 1:
                raise ConfigError(f"-H/--hosts {hosts!r} has no host with the {group} slots "
                                  f"a replica group of --shard-size {group} needs")
            if np == 0:
                raise ConfigError(f"-H/--hosts {hosts!r} gives no slots")
        else:
            raise ConfigError("-np is required unless -H/--hosts or --min-np is given")
    launcher_target = launcher_name(launcher)
    no_source = static_hosts is None and hostfile is None and discovery_script is None \
        and discovery is None
    if no_source and launcher_target in IMPLIED_DISCOVERY:
        discovery = IMPLIED_DISCOVERY[launcher_target]
    elif no_source:
        static_hosts = (("localhost", np),)
    elastic = min_np is not None or discovery_script is not None or discovery is not None
    token = read_secret(webhook_token_file, protocol.ENV_WEBHOOK_TOKEN, "--webhook-token-file")
    key = read_secret(event_secret_file, protocol.ENV_EVENT_SECRET, "--event-secret-file")
    if agent_token is None:
        agent_token = read_secret(agent_token_file, protocol.ENV_AGENT_TOKEN,
                                  "--agent-token-file")
    for name, value in (("webhook", token), ("agent", agent_token)):
        if value is not None and len(value) < MIN_TOKEN_LENGTH:
            raise ConfigError(f"the {name} token is {len(value)} characters; use at least "
                              f"{MIN_TOKEN_LENGTH} (e.g. openssl rand -hex 32)")
    if discovery is not None and parse_spec(discovery).target == "webhook" and token is None:
        raise ConfigError("--discovery webhook needs a token for the host-change webhook: "
                          "--webhook-token-file FILE or ELASTICRUN_WEBHOOK_TOKEN")
    if resume and state_dir is None:
        raise ConfigError("--resume needs --state-dir DIR: the directory of the journal the "
                          "job's first driver kept")
    if max_np is None and not elastic:
        max_np = np
    config = DriverConfig(
        command=tuple(command),
        np=np,
        min_np=min_np if min_np is not None else np,
        max_np=max_np,
        shard_size=shard_size,
        hosts=static_hosts,
        hostfile=hostfile,
        discovery_script=discovery_script,
        discovery_interval=discovery_interval,
        discovery_timeout=discovery_timeout,
        slots_per_host=slots_per_host,
        start_timeout=start_timeout,
        elastic_timeout=elastic_timeout,
        reset_limit=reset_limit,
        max_restarts=max_restarts,
        host_snapshots=host_snapshots,
        checkpoint_dir=None if checkpoint_dir is None else checkpoint_dir.absolute(),
        checkpoint_interval=checkpoint_interval,
        init_timeout=init_timeout,
        torchrun=torchrun or TorchrunSettings(),
        blacklist_cooldown=_cooldown(blacklist_cooldown_range, permanent_blacklist),
        collective_timeout=collective_timeout,
        driver_timeout=driver_timeout,
        hang_detection=hang_detection,
        hang_timeout=hang_timeout,
        stuck_timeout=stuck_timeout,
        stragglers=stragglers,
        backend=backend,
        network_interface=network_interface,
        output_filename=output_filename,
        prefix_timestamp=prefix_output_with_timestamp,
        ssh_port=ssh_port,
        ssh_identity_file=ssh_identity_file,
        ssh_accept_new_host_keys=ssh_accept_new_host_keys,
        remote_python=remote_python,
        working_dir=(working_dir or Path.cwd()).absolute(),
        discovery=discovery,
        port=port,
        bind=tuple(_check_bind(address) for address in bind),
        event_webhooks=tuple(_check_url(url) for url in event_webhooks),
        event_log=event_log,
        state_dir=state_dir,
        resume=resume,
        webhook_token=token,
        event_key=key.encode() if key is not None else None,
        launcher=launcher,
        agent_token=agent_token,
    )
    if resume and launcher_target not in (*AGENT_LAUNCHERS, *OWN_AGENT_LAUNCHERS):
        raise ConfigError(f"--resume takes back workers that outlive their driver: those "
                          f"of --launcher local, ssh or auto and those under elasticrun "
                          f"agents; --launcher {launcher_target}'s workers end with it, so "
                          f"there would be nothing to take back")
    if stop_grace_period is not None:
        config = replace(config, stop_grace_period=stop_grace_period)
    if config.uses_agents and not config.bind:
        # Agents connect from wherever they run (every request is authenticated).
        config = replace(config, bind=("0.0.0.0",))
    return config


def _check_bind(address: str) -> str:
    try:
        return str(ipaddress.ip_address(address.strip("[]")))
    except ValueError:
        raise ConfigError(f"--bind {address!r}: expected an IP address of this machine "
                          f"(or 0.0.0.0 for all interfaces)") from None


def _check_url(url: str) -> str:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"--event-webhook {url!r}: expected an http:// or https:// URL")
    return url


def build_parts(config: DriverConfig) -> JobParts:
    agents = AgentHub(config.agent_token) if config.uses_agents and config.agent_token \
        else None
    if agents is None and config.state_dir is not None \
            and launcher_name(config.launcher) in OWN_AGENT_LAUNCHERS:
        # workers run under agents of the job's own (launch/agents/job_agents.py)
        agents = AgentHub(job_agent_token(config.state_dir), own=True)
    return JobParts(build_discovery(config, agents),
                    load_launcher(config.launcher, config, agents), agents)


def build_discovery(config: DriverConfig, agents: AgentHub | None = None) -> HostDiscovery:
    default_slots = config.slots_per_host or 1
    if config.discovery is not None:
        options = DiscoveryOptions(None, default_slots, config.discovery_timeout, agents)
        return load_discovery(config.discovery, options)
    if config.discovery_script is not None:
        script = ScriptDiscovery(config.discovery_script, default_slots, config.discovery_timeout)
        script.check()
        return script
    if config.hostfile is not None:
        return HostfileDiscovery(config.hostfile, default_slots)
    assert config.hosts is not None
    return StaticDiscovery(dict(config.hosts))


def _cooldown(cooldown_range: tuple[float, float] | None,
              permanent: bool) -> tuple[float, float] | None:
    """The blacklist's cooldown range (None: blacklisted slots and hosts never return)."""
    if permanent and cooldown_range is not None:
        raise ConfigError("give --blacklist-cooldown-range or --permanent-blacklist, not both")
    if permanent:
        return None
    return DEFAULT_BLACKLIST_COOLDOWN_S if cooldown_range is None else cooldown_range
