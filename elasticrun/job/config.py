"""Every setting of a job, as frozen dataclasses. The CLI only fills these in."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from elasticrun.job.errors import ConfigError

BACKENDS = ("auto", "gloo", "nccl")  # --backend: which carries CUDA tensors
STRAGGLERS = ("report", "evict", "off")  # --stragglers: what a persistently slow member gets
AGENT_LAUNCHERS = ("agent",)  # launchers whose workers run under agents
# Restarts of a round of scripts that never call er.init(), after a failure, under
# elasticrun's own form (-np); torchrun's form defaults to torchrun's 0.
DEFAULT_MAX_RESTARTS = 3
# How long the members of a round wait for one that has not called er.init() yet (its
# imports, data and model before it): loading data for minutes is ordinary.
DEFAULT_INIT_TIMEOUT_S = 1800.0
DEFAULT_CHECKPOINT_INTERVAL_S = 60.0
# --blacklist-cooldown-range's default: a blacklisted slot or host returns after 20-30 s the
# first time, twice that the next (Horovod's schedule), at most 5 minutes later.
DEFAULT_BLACKLIST_COOLDOWN_S = (10.0, 300.0)


def _target(spec: str) -> str:
    """The plugin a --launcher/--discovery value names (plugins.parse_spec, without checks)."""
    head, _, rest = spec.strip().partition(":")
    return f"{head}:{rest.partition(':')[0]}" if "." in head else head


@dataclass(frozen=True)
class TorchrunSettings:
    """torchrun's worker environment beyond ranks and sizes, and how its output is kept
    (torchrun's --rdzv-id, --role, --log-dir, --redirects, --tee, --local-ranks-filter,
    --virtual-local-rank). The defaults are those of a job started in elasticrun's form."""

    run_id: str | None = None  # TORCHELASTIC_RUN_ID; None: the job's id
    role: str = "default"  # ROLE_NAME
    log_dir: Path | None = None  # each worker's output and error file kept under it
    # Output of a local rank (absent: every local rank) kept in files only / also in files:
    # local rank -> streams ("stdout", "stderr"); -1 stands for every local rank.
    redirects: tuple[tuple[int, tuple[str, ...]], ...] = ()
    tee: tuple[tuple[int, tuple[str, ...]], ...] = ()
    local_ranks_filter: frozenset[int] | None = None  # None: every local rank on the console
    virtual_local_rank: bool = False  # LOCAL_RANK=0, CUDA_VISIBLE_DEVICES=<local rank>
    nodes_of: int | None = None  # torchrun's multi-node form: --nproc-per-node (messages)
    # torchrun's form: the prefix of a teed line, a string.Template of role_name, rank and
    # local_rank (TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, else torchrun's "[role<local
    # rank>]:"); lines not teed reach the console as written. None: elasticrun's own form,
    # every line "[rank]<stream>:".
    line_prefix: str | None = None


@dataclass(frozen=True)
class DriverConfig:
    command: tuple[str, ...]
    np: int
    min_np: int
    max_np: int | None
    # --shard-size: rounds are made of replica groups of this many consecutive ranks, each
    # on one host (driver/rounds/replica_groups.py); 1: any size, as without HSDP
    shard_size: int = 1
    hosts: tuple[tuple[str, int], ...] | None = None
    hostfile: Path | None = None
    discovery_script: Path | None = None
    discovery_interval: float = 1.0
    discovery_timeout: float = 10.0
    slots_per_host: int | None = None
    start_timeout: float = 30.0
    # torchrun's form with --nnodes MIN:MAX: once -np slots (MIN nodes) are there, how long
    # the first round waits for more (up to --max-np) before it starts; None: it starts
    last_call: float | None = None
    # A socket already listening on the driver's address and `port`, served instead of
    # binding one (torchrun's form: the launcher that bound the endpoint hosts the job)
    listen_fd: int | None = None
    elastic_timeout: float = 600.0
    reset_limit: int | None = None
    # Restarts after a failure of a round whose scripts never called er.init() (restart
    # mode); host changes restart such a round too, without counting.
    max_restarts: int = DEFAULT_MAX_RESTARTS
    # Commits kept outside the workers (a total loss restarts from them): a snapshot in each
    # host's memory, and durable checkpoints in a directory, at most once an interval.
    host_snapshots: bool = True
    checkpoint_dir: Path | None = None
    checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL_S
    init_timeout: float = DEFAULT_INIT_TIMEOUT_S  # a member's first er.init(), others waiting
    torchrun: TorchrunSettings = field(default_factory=TorchrunSettings)
    # MIN MAX of blacklisted slots' and hosts' cooldowns; None: they never return
    blacklist_cooldown: tuple[float, float] | None = DEFAULT_BLACKLIST_COOLDOWN_S
    collective_timeout: float = 60.0
    backend: str = "auto"  # for CUDA tensors: auto, gloo or nccl (the workers choose)
    driver_timeout: float = 300.0  # --driver-grace: workers outlive a silent driver this long
    hang_detection: bool = True  # stalled collectives make the driver look for a hung member
    hang_timeout: float = 5.0  # a silent member whose host cannot say what it does
    stuck_timeout: float = 30.0  # a training thread outside collectives, idle, peers waiting
    stragglers: str = "report"  # a member persistently slower than its peers: report|evict|off
    network_interface: str | None = None
    output_filename: Path | None = None
    prefix_timestamp: bool = False
    stop_grace_period: float = 5.0
    ssh_port: int | None = None
    ssh_identity_file: Path | None = None
    ssh_accept_new_host_keys: bool = False
    remote_python: str | None = None  # None: this interpreter's path
    working_dir: Path = field(default_factory=Path.cwd)
    discovery: str | None = None  # --discovery NAME[:ARG] or module.path:factory[:ARG]
    port: int = 0  # the driver's server; 0: any free port
    bind: tuple[str, ...] = ()  # addresses the driver listens on; (): only those it needs
    webhook_token: str | None = field(default=None, repr=False)
    event_webhooks: tuple[str, ...] = ()
    event_log: Path | None = None
    state_dir: Path | None = None  # the journal (driver/journal/), for a restarted driver
    resume: bool = False  # take the job in state_dir back (a restarted driver)
    event_key: bytes | None = field(default=None, repr=False)
    timeline_filename: Path | None = None  # the job's trace, written by the driver
    timeline_mark_cycles: bool = False
    launcher: str = "auto"  # --launcher NAME[:ARG] or module.path:factory[:ARG]
    agent_token: str | None = field(default=None, repr=False)  # authenticates agents

    @property
    def uses_agents(self) -> bool:
        """Whether `elasticrun agent`s connect to this job's driver."""
        return _target(self.launcher) in AGENT_LAUNCHERS or (
            self.discovery is not None and _target(self.discovery) == "agents")

    @property
    def elastic(self) -> bool:
        """A job is elastic when its membership may change: discovery, or a range of sizes."""
        return self.dynamic_hosts or self.min_np != self.np or self.max_np != self.np

    @property
    def dynamic_hosts(self) -> bool:
        """Whether the host set can change while the job runs."""
        return self.discovery_script is not None or self.discovery is not None

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError("no command given: expected 'elasticrun [OPTIONS] COMMAND [ARGS]...'")
        if self.np < 1:
            raise ConfigError(f"-np must be at least 1, got {self.np}")
        if self.min_np < 1 or self.min_np > self.np:
            raise ConfigError(f"--min-np must be between 1 and -np ({self.np}), got {self.min_np}")
        if self.max_np is not None and self.max_np < self.np:
            raise ConfigError(f"--max-np must be at least -np ({self.np}), got {self.max_np}")
        if self.shard_size < 1:
            raise ConfigError(f"--shard-size must be at least 1, got {self.shard_size}")
        for flag, size in (("-np", self.np), ("--min-np", self.min_np),
                           ("--max-np", self.max_np)):
            if size is not None and size % self.shard_size:
                raise ConfigError(f"{flag} {size} is not a multiple of --shard-size "
                                  f"{self.shard_size}: every replica group has "
                                  f"{self.shard_size} workers")
        sources = [s for s in (self.hosts, self.hostfile, self.discovery_script, self.discovery)
                   if s is not None]
        if len(sources) > 1:
            raise ConfigError("give only one of -H/--hosts, --hostfile, --host-discovery-script, "
                              "--discovery")
        if self.event_webhooks and not self.event_key:
            raise ConfigError("--event-webhook needs a key to sign events with: "
                              "--event-secret-file FILE or ELASTICRUN_EVENT_SECRET")
        if self.timeline_mark_cycles and self.timeline_filename is None:
            raise ConfigError("--timeline-mark-cycles needs --timeline-filename")
        if self.backend not in BACKENDS:
            raise ConfigError(f"--backend must be one of {', '.join(BACKENDS)}, got "
                              f"{self.backend!r}")
        if self.stragglers not in STRAGGLERS:
            raise ConfigError(f"--stragglers must be one of {', '.join(STRAGGLERS)}, got "
                              f"{self.stragglers!r}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be 0..65535, got {self.port}")
        if self.uses_agents and self.agent_token is None:
            raise ConfigError("agents need the job's agent token: --agent-token-file FILE or "
                              "ELASTICRUN_AGENT_TOKEN")
        if self.uses_agents and self.port == 0:
            raise ConfigError("agents connect to the driver at a port they know: give --port "
                              "PORT (and the agents --driver http://THIS_HOST:PORT)")
        for name in ("discovery_interval", "discovery_timeout", "start_timeout",
                     "elastic_timeout", "collective_timeout", "driver_timeout",
                     "hang_timeout", "stuck_timeout", "init_timeout"):
            if getattr(self, name) <= 0:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} must be positive, got {getattr(self, name)}")
        if self.reset_limit is not None and self.reset_limit < 0:
            raise ConfigError(f"--reset-limit must be 0 or more, got {self.reset_limit}")
        if self.checkpoint_interval < 0:
            raise ConfigError(f"--checkpoint-interval must be 0 or more seconds, got "
                              f"{self.checkpoint_interval:g}")
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts must be 0 or more, got {self.max_restarts}")
        if self.blacklist_cooldown is not None:
            low, high = self.blacklist_cooldown
            if not 0 < low <= high:
                raise ConfigError(
                    f"--blacklist-cooldown-range expects 0 < MIN <= MAX, got {low:g} {high:g}"
                )
