"""Carrying out torchrun's form on this node (torchrun_plan.py decides): one node -> the
job's driver here; one node of several -> whether this node hosts (its addresses, its
port), then the driver here with this node's agent beside it as a child process, or this
node's agent alone, in this process. Exits with the job's result on every node."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from elasticrun import protocol
from elasticrun.agent.runner import Agent, AgentSettings
from elasticrun.cli import machine
from elasticrun.cli.job import run_job
from elasticrun.cli.node_claim import bind_endpoint, claim_place, places_directory
from elasticrun.cli.torchrun_args import TorchrunArgs
from elasticrun.cli.torchrun_plan import (
    Nodes,
    decide_hosting,
    derived_token,
    node_agent_settings,
    node_result,
    nodes_driver_config,
    plan,
)
from elasticrun.discovery.parsing import check_host
from elasticrun.job.config import DriverConfig, TorchrunSettings
from elasticrun.job.errors import ConfigError
from elasticrun.job.tokens import MIN_TOKEN_LENGTH, read_secret
from elasticrun.system.spawning import die_with_parent

log = logging.getLogger("elasticrun")

CHILD_AGENT_END_S = 10.0  # after the job's end, how long the hosting node's agent may take


def launch(args: TorchrunArgs, argv: Sequence[str], log_level: str,
           timeline: Mapping[str, object]) -> int:
    for note in args.notes:
        log.warning("%s", note)
    target = plan(args)
    with stopping_signals(args.signals):
        if isinstance(target, DriverConfig):
            config = dataclasses.replace(target, torchrun=kept_logs(target.torchrun),
                                         **timeline)  # type: ignore[arg-type]
            return run_job(config, argv)
        return run_nodes(args, target, argv, log_level, timeline)


def run_nodes(args: TorchrunArgs, nodes: Nodes, argv: Sequence[str], log_level: str,
              timeline: Mapping[str, object]) -> int:
    """This launcher is one node of the job (node_claim.py): its place on this machine is
    held for its whole life, and so is the endpoint when it binds it."""
    base = _node_name(args.local_addr)
    try:
        place = claim_place(places_directory(args.run_id, f"{nodes.host}:{nodes.port}", base),
                            base)
    except OSError as exc:
        raise ConfigError(f"cannot claim this launcher's place among the nodes on this "
                          f"machine: {exc.strerror or exc}") from None
    try:
        return _run_node(args, nodes, place.name, argv, log_level, timeline)
    finally:
        place.close()


def _run_node(args: TorchrunArgs, nodes: Nodes, name: str, argv: Sequence[str],
              log_level: str, timeline: Mapping[str, object]) -> int:
    own = machine.own_address(machine.resolve(nodes.host))
    listening = None
    if nodes.hosting or (nodes.hosting is None and own is not None):
        try:
            listening = bind_endpoint(own or "0.0.0.0", nodes.port)
        except OSError as exc:
            raise ConfigError(f"--rdzv-endpoint {nodes.host}:{nodes.port}: cannot listen "
                              f"there: {exc.strerror or exc}") from None
    hosting = decide_hosting(nodes, own, port_taken=listening is None)
    token, derived = agent_token(args)
    if not hosting.driver:
        log.info("node %s: this node's agent only (%s); the job's driver: %s:%d", name,
                 hosting.why, nodes.host, nodes.port)
        settings = node_agent_settings(args, nodes, nodes.host, name, token, Path.cwd())
        return asyncio.run(_run_agent(settings))
    assert listening is not None
    log.info("node %s hosts the job's driver on port %d (%s)", name, nodes.port, hosting.why)
    if derived:
        log.warning("no agent token given: the nodes' token is derived from --rdzv-id %r, so "
                    "anyone who can reach %s:%d and knows the run id can join this job (as "
                    "torchrun's TCPStore, which has none). Set ELASTICRUN_AGENT_TOKEN or "
                    "--rdzv-conf agent_token_file=FILE on every node to close it",
                    args.run_id, nodes.host, nodes.port)
    if own is None:
        log.warning("%s is not an address of this node: the driver listens on every "
                    "interface", nodes.host)
    config = nodes_driver_config(args, nodes, own or "0.0.0.0", token)
    config = dataclasses.replace(config, torchrun=kept_logs(config.torchrun),
                                 listen_fd=listening.detach(),  # the driver's now
                                 **timeline)  # type: ignore[arg-type]
    # the agent dials an address other nodes reach too: its workers dial the same
    settings = node_agent_settings(args, nodes, own or nodes.host, name, token, Path.cwd())
    agent = start_child_agent(settings, log_level)
    code = 1
    try:
        code = run_job(config, argv)
    finally:
        agent_code = stop_child_agent(agent)
    code, why = node_result(code, agent_code)
    if why is not None:
        log.error("%s", why)
    return code


def agent_token(args: TorchrunArgs) -> tuple[str, bool]:
    """The nodes' agent token (--rdzv-conf agent_token_file, else ELASTICRUN_AGENT_TOKEN),
    and whether it was derived from the run id instead (neither given)."""
    token = read_secret(args.rdzv.agent_token_file, protocol.ENV_AGENT_TOKEN,
                        "--rdzv-conf agent_token_file")
    if token is None:
        return derived_token(args.run_id), True
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(f"the agent token is {len(token)} characters; use at least "
                          f"{MIN_TOKEN_LENGTH} (e.g. openssl rand -hex 32)")
    return token, False


def kept_logs(settings: TorchrunSettings) -> TorchrunSettings:
    """--redirects or --tee without --log-dir: torchrun keeps the files in a new temporary
    directory, and so does elasticrun (it says where)."""
    if settings.log_dir is not None or not (settings.redirects or settings.tee):
        return settings
    directory = Path(tempfile.mkdtemp(prefix="torchelastic_"))
    log.info("--redirects/--tee without --log-dir: the workers' output is kept under %s",
             directory)
    return dataclasses.replace(settings, log_dir=directory)


def _node_name(local_addr: str | None) -> str:
    name = machine.node_name(local_addr, os.environ)
    try:
        return check_host(name)
    except ValueError as exc:
        flag = "--local-addr" if local_addr else "this node's name"
        raise ConfigError(f"{flag} {name!r}: {exc}") from None


async def _run_agent(settings: AgentSettings) -> int:
    return await Agent(settings).run()


def child_agent_argv(settings: AgentSettings, log_level: str) -> list[str]:
    """The hosting node's agent's command line (its token goes in its environment)."""
    argv = [sys.executable, "-m", "elasticrun", "agent", "--driver", settings.driver,
            "--host", settings.host, "--slots", str(settings.slots),
            "--driver-grace", f"{settings.driver_grace:g}",
            "--log-level", "DEBUG" if log_level == "DEBUG" else "WARNING"]
    if settings.stop_grace > 0:
        argv += ["--stop-grace", f"{settings.stop_grace:g}"]
    if settings.working_dir is not None:
        argv += ["--working-dir", str(settings.working_dir)]
    return argv


def start_child_agent(settings: AgentSettings, log_level: str) -> subprocess.Popen[bytes]:
    """In a session of its own, and killed if this process dies first."""
    env = {**os.environ, protocol.ENV_AGENT_TOKEN: settings.token}
    try:
        return subprocess.Popen(child_agent_argv(settings, log_level), env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=die_with_parent(signal.SIGKILL))
    except OSError as exc:
        raise ConfigError(f"cannot start this node's agent: {exc.strerror or exc}") from None


def stop_child_agent(agent: subprocess.Popen[bytes]) -> int:
    """It ends on its own when the driver tells it the job is over; else it is killed (its
    workers with it: they die with their agent). Reaped either way; its exit code."""
    try:
        return agent.wait(CHILD_AGENT_END_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(agent.pid, signal.SIGKILL)
        return agent.wait()


@contextlib.contextmanager
def stopping_signals(signals: Sequence[signal.Signals]) -> Iterator[None]:
    """--signals-to-handle: each listed signal beyond SIGINT and SIGTERM stops the job as
    SIGTERM does (the driver's and the agent's own handling of it)."""
    def as_sigterm(_signum: int, _frame: object) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    previous = {sig: signal.signal(sig, as_sigterm) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
