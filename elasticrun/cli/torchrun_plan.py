"""torchrun's options (TorchrunArgs) -> what runs on this node. Pure: the machine's answers
(whether the endpoint is one of its addresses, whether its port is taken) come in as values.

- ONE NODE (`--standalone`; `--nnodes 1` without `--rdzv-endpoint`, or with one on port 0;
  torchrun's own turn of the static backend with one node and no `--master-port` into a
  standalone run): a DriverConfig of `nproc` local workers.
- SEVERAL NODES (`--rdzv-endpoint HOST:PORT`, or the static form `--master-addr A
  --master-port P`): the same line runs on every node. The node that owns the endpoint
  serves the job's driver on PORT; every node, that one too, runs an elasticrun agent that
  connects out to it with the job's agent token.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

from elasticrun.agent.runner import REFUSED_EXIT, AgentSettings
from elasticrun.api.job_config import build_config
from elasticrun.cli.torchrun_args import TorchrunArgs
from elasticrun.cli.torchrun_rendezvous import (
    C10D_DEFAULT_PORT,
    JOIN_TIMEOUT_S,
    LAST_CALL_TIMEOUT_S,
    STATIC_DEFAULT_PORT,
    parse_endpoint,
)
from elasticrun.job.config import DriverConfig
from elasticrun.job.errors import ConfigError

ONE_NODE_START_TIMEOUT_S = 30.0  # elasticrun's --start-timeout default
TOKEN_PREFIX = "elasticrun torchrun-form agent token v1:"
TOKEN_HINT = ("do all nodes give the same --rdzv-id? Or the same ELASTICRUN_AGENT_TOKEN / "
              "--rdzv-conf agent_token_file")


@dataclass(frozen=True)
class Nodes:
    """One node of a job of several."""

    host: str  # the endpoint's host, as given
    port: int
    hosting: bool | None  # decided by the options (is_host, static node rank); None: probe
    join_timeout: float  # --rdzv-conf join_timeout: how long nodes wait for each other


@dataclass(frozen=True)
class Hosting:
    driver: bool  # this node serves the job's driver (and runs an agent beside it)
    why: str


def plan(args: TorchrunArgs) -> DriverConfig | Nodes:
    if args.standalone:
        if args.max_nodes > 1:
            raise ConfigError(f"--standalone runs one node, --nnodes asks for up to "
                              f"{args.max_nodes}: give --rdzv-endpoint HOST:PORT instead")
        return one_node_config(args)
    if not args.endpoint and args.max_nodes == 1:
        return one_node_config(args)
    if args.endpoint:
        default = C10D_DEFAULT_PORT if args.backend == "c10d" else None
        host, port = parse_endpoint(args.endpoint, default)
    elif args.backend == "static":
        default = STATIC_DEFAULT_PORT if args.master_port is None else args.master_port
        host, port = parse_endpoint(args.master_addr, default)
    else:
        raise ConfigError(f"--nnodes {args.min_nodes}:{args.max_nodes} needs --rdzv-endpoint "
                          f"HOST:PORT: the node that owns it hosts the job")
    if port == 0:  # torchrun's "any free port" (`--rdzv-endpoint localhost:0`): one node
        if args.max_nodes == 1:
            return one_node_config(args)
        raise ConfigError(f"--rdzv-endpoint {host}:0 with --nnodes {args.max_nodes}: the other "
                          f"nodes cannot know which port; give the port")
    hosting = args.rdzv.is_host
    if hosting is None and args.backend == "static" and args.node_rank is not None:
        hosting = args.node_rank == 0
    return Nodes(host, port, hosting, args.rdzv.join_timeout or JOIN_TIMEOUT_S)


def one_node_config(args: TorchrunArgs) -> DriverConfig:
    return _config(args, np=args.nproc, hosts=f"localhost:{args.nproc}",
                   start_timeout=args.rdzv.join_timeout or ONE_NODE_START_TIMEOUT_S)


def decide_hosting(nodes: Nodes, own_address: str | None, port_taken: bool) -> Hosting:
    """Whether this node serves the driver: as the options say (is_host, the static form's
    node rank 0), else when the endpoint's address is one of this node's and its port is
    free (taken: another elasticrun on this node hosts the job already)."""
    where = f"{nodes.host}:{nodes.port}"
    if nodes.hosting is not None:
        if nodes.hosting and port_taken:
            raise ConfigError(f"--rdzv-endpoint {where}: port {nodes.port} is in use on this "
                              f"node, which hosts the job (is_host=1, or node rank 0)")
        return Hosting(nodes.hosting, "as --rdzv-conf is_host or --node-rank says")
    if own_address is None:
        return Hosting(False, f"{nodes.host} is not an address of this node")
    if port_taken:
        return Hosting(False, f"port {nodes.port} on {own_address} is taken here: another "
                              f"elasticrun on this node hosts the job")
    named = nodes.host if nodes.host == own_address else f"{nodes.host} ({own_address})"
    return Hosting(True, f"{named} is an address of this node")


def nodes_driver_config(args: TorchrunArgs, nodes: Nodes, bind: str, token: str
                        ) -> DriverConfig:
    config = _config(args, np=args.min_nodes * args.nproc,
                     max_np=args.max_nodes * args.nproc, start_timeout=nodes.join_timeout,
                     elastic_timeout=nodes.join_timeout, launcher="agent",
                     discovery="agents", port=nodes.port, bind=(bind,), agent_token=token)
    # as torchrun's rendezvous: MIN nodes joined, more may join for last_call_timeout
    last_call = args.rdzv.last_call_timeout or LAST_CALL_TIMEOUT_S \
        if args.max_nodes > args.min_nodes else None
    return replace(config, torchrun=replace(config.torchrun, nodes_of=args.nproc),
                   last_call=last_call)


def node_agent_settings(args: TorchrunArgs, nodes: Nodes, dial: str, name: str, token: str,
                        working_dir: Path) -> AgentSettings:
    """This node's agent, dialing the driver at `dial` (an address or the endpoint's host)."""
    host = f"[{dial}]" if ":" in dial else dial
    own = args.own
    return AgentSettings(
        driver=f"http://{host}:{nodes.port}", token=token, host=name, slots=args.nproc,
        driver_grace=float(own.get("driver_timeout", 300.0)),
        stop_grace=args.shutdown_timeout if args.shutdown_timeout else 5.0,
        working_dir=working_dir, first_contact_timeout=nodes.join_timeout,
        exit_with_job=True, token_hint=TOKEN_HINT)


def node_result(job_code: int, agent_code: int) -> tuple[int, str | None]:
    """The hosting node's exit code: the job's, unless the driver refused this node's own
    agent (then the job ran without this node's workers, and this node never exits 0), and
    why, in one line."""
    if job_code == 0 and agent_code == REFUSED_EXIT:
        return REFUSED_EXIT, ("the job's driver refused this node's agent (its line above "
                              "says why): the job ran without this node's workers")
    return job_code, None


def derived_token(run_id: str) -> str:
    """The agent token of a job whose nodes were given none: from its --rdzv-id alone, so
    anyone who can reach the endpoint and knows the run id can join (torchrun's TCPStore
    has no authentication at all)."""
    return hashlib.sha256((TOKEN_PREFIX + run_id).encode()).hexdigest()


def _config(args: TorchrunArgs, np: int, start_timeout: float, **more: object
            ) -> DriverConfig:
    own = dict(args.own)
    defaults: dict[str, object] = {
        "hosts": None, "min_np": None, "max_np": np, "hostfile": None,
        "discovery_script": None, "discovery_interval": 1.0, "discovery_timeout": 10.0,
        "slots_per_host": None, "elastic_timeout": 600.0, "reset_limit": None,
        "blacklist_cooldown_range": None, "collective_timeout": 60.0,
        "network_interface": None, "output_filename": None,
        "prefix_output_with_timestamp": False}
    return build_config(  # type: ignore[arg-type]
        **{**defaults, **own, **more}, command=args.command, np=np,
        start_timeout=start_timeout, max_restarts=args.max_restarts, torchrun=args.settings,
        stop_grace_period=args.shutdown_timeout)
