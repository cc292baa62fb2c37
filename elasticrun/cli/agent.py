"""`elasticrun agent`: click options -> AgentSettings -> asyncio.run(Agent.run())."""

from __future__ import annotations

import asyncio
import socket
import sys
import urllib.parse
from pathlib import Path

import click

from elasticrun import protocol
from elasticrun.agent.runner import Agent, AgentSettings
from elasticrun.cli.options import CONTEXT, positive
from elasticrun.discovery.parsing import MAX_SLOTS_PER_HOST, check_host
from elasticrun.job.errors import ConfigError
from elasticrun.job.tokens import MIN_TOKEN_LENGTH, read_secret
from elasticrun.system.process_setup import setup_logging


@click.command(context_settings=CONTEXT)
@click.option("--driver", "driver", required=True, metavar="URL",
              help="The driver's server, e.g. http://driver:29400 (its --port).")
@click.option("--token-file", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="The job's agent token (the driver's --agent-token-file). Or set "
                   "ELASTICRUN_AGENT_TOKEN.")
@click.option("--slots", type=click.IntRange(1, MAX_SLOTS_PER_HOST), default=1,
              show_default=True, help="Workers this host runs (e.g. its GPUs).")
@click.option("--host", "host", metavar="NAME",
              help="This host's name in the job [default: this machine's host name].")
@click.option("--driver-grace", type=float, default=300.0, show_default=True,
              callback=positive, help="Seconds the driver may be unreachable before the "
                                       "agent stops its workers and exits 1.")
@click.option("--drain-timeout", type=float, default=600.0, show_default=True,
              callback=positive, help="After SIGTERM, seconds the workers get to leave at a "
                                       "commit before they are stopped.")
@click.option("--stop-grace", type=float, default=5.0, show_default=True, callback=positive,
              help="Seconds between SIGTERM and SIGKILL when a worker is stopped.")
@click.option("--working-dir", type=click.Path(path_type=Path, file_okay=False),
              metavar="DIR", help="Directory workers run in [default: the driver's "
                                  "--working-dir].")
@click.option("--ready-file", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="A file that exists while the agent is connected to the driver (for a "
                   "readiness probe).")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"],
                                               case_sensitive=False),
              default="INFO", show_default=True)
def agent_command(driver: str, token_file: Path | None, slots: int, host: str | None,
                  driver_grace: float, drain_timeout: float, stop_grace: float,
                  working_dir: Path | None, ready_file: Path | None, log_level: str) -> None:
    """Runs this node's share of an elasticrun job: connects out to the driver (no sshd,
    no inbound port), registers HOST with SLOTS, and starts and stops workers when the
    driver says so. Exits 0 when the job ends or a drain (SIGTERM) completes; 1 when
    the driver is gone for longer than --driver-grace; 2 on a usage error or refusal.

    \b
    Example:
      elasticrun agent --driver http://driver:29400 --token-file /etc/er/token --slots 8
    """
    settings = agent_settings(driver, token_file, slots, host, driver_grace, drain_timeout,
                              stop_grace, working_dir, ready_file)
    setup_logging(log_level.upper(), f"elasticrun agent {settings.host}")
    sys.exit(asyncio.run(_run(settings)))


def agent_settings(driver: str, token_file: Path | None, slots: int, host: str | None,
                   driver_grace: float, drain_timeout: float, stop_grace: float,
                   working_dir: Path | None, ready_file: Path | None,
                   **_: object) -> AgentSettings:
    """The agent command's options, checked (one ConfigError line each) -> its settings."""
    return AgentSettings(
        driver=_check_url(driver), token=_read_token(token_file),
        host=_check_host(host or socket.gethostname()), slots=slots,
        driver_grace=driver_grace, stop_grace=stop_grace, drain_timeout=drain_timeout,
        working_dir=working_dir.absolute() if working_dir else None, ready_file=ready_file)


async def _run(settings: AgentSettings) -> int:
    return await Agent(settings).run()


def _check_url(url: str) -> str:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "http" or not parsed.hostname or parsed.path not in ("", "/"):
        raise ConfigError(f"--driver {url!r}: expected http://HOST:PORT (the driver's --port)")
    try:
        parsed.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ConfigError(f"--driver {url!r}: bad port") from None
    return url.rstrip("/")


def _check_host(host: str) -> str:
    try:
        return check_host(host)
    except ValueError as exc:
        raise ConfigError(f"--host {host!r}: {exc}") from None


def _read_token(path: Path | None) -> str:
    token = read_secret(path, protocol.ENV_AGENT_TOKEN, "--token-file")
    if token is None:
        raise ConfigError("no agent token: give --token-file FILE or set "
                          f"{protocol.ENV_AGENT_TOKEN}")
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(f"the agent token is {len(token)} characters; the driver's needs "
                          f"at least {MIN_TOKEN_LENGTH}")
    return token
