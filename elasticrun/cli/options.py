"""What the command forms and subcommands share in how they read options: the context, and
the options of elasticrun's own that both forms take, each defined once (click only:
`elasticrun agent` imports this, and must not pay for the driver)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from elasticrun.job.config import BACKENDS, DEFAULT_INIT_TIMEOUT_S
from elasticrun.job.config import STRAGGLERS as STRAGGLER_MODES

F = TypeVar("F", bound=Callable[..., Any])
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def positive(_ctx: click.Context, _param: click.Parameter, value: float | None
             ) -> float | None:
    """click callback: a number of seconds, above 0."""
    if value is not None and value <= 0:
        raise click.BadParameter(f"must be positive, got {value:g}")
    return value


INIT_TIMEOUT = click.option(
    "--init-timeout", type=float, default=DEFAULT_INIT_TIMEOUT_S, show_default=True,
    callback=positive,
    help="Seconds the members of a round wait for one that has not called er.init() yet: its "
         "set-up before er.init() (imports, data, model) may be slow.")
COLLECTIVE_TIMEOUT = click.option(
    "--collective-timeout", type=float, default=60.0, show_default=True, callback=positive,
    help="Seconds a collective may block before it counts as a failure.")
HANG_DETECTION = click.option(
    "--hang-detection/--no-hang-detection", default=True, show_default=True,
    help="Find a hung worker (stopped, frozen host, cut link) in about a second, instead of "
         "at the collective timeout: a collective that waits far longer than usual makes the "
         "driver probe the round's members.")
STRAGGLERS = click.option(
    "--stragglers", type=click.Choice(STRAGGLER_MODES), default="report", show_default=True,
    help="A worker persistently slower than its peers (a throttled GPU, a noisy neighbour): "
         "report names it (log, event, /status, metrics); evict also takes its slot out at "
         "a commit, when the job keeps --min-np and is projected faster without it (it may "
         "come back after the blacklist cooldown); off measures nothing.")
HANG_TIMEOUT = click.option(
    "--hang-timeout", type=float, default=5.0, show_default=True, callback=positive,
    help="Seconds a worker that answers no probe is given when its host cannot say whether "
         "its process runs (launchers without process states).")
STUCK_TIMEOUT = click.option(
    "--stuck-timeout", type=float, default=30.0, show_default=True, callback=positive,
    help="Seconds a worker's training thread may stay outside collectives, using no CPU, "
         "while its peers wait in one (a deadlocked data loader) before it counts as hung.")
BACKEND = click.option(
    "--backend", type=click.Choice(BACKENDS), default="auto", show_default=True,
    envvar="ELASTICRUN_BACKEND", show_envvar=True,
    help="What carries CUDA tensors: nccl, gloo (through host memory), or auto (NCCL where "
         "every worker has a GPU and torch has NCCL). CPU tensors always travel on Gloo.")
DRIVER_GRACE = click.option(
    "--driver-grace", "--driver-timeout", "driver_timeout", type=float, default=300.0,
    show_default=True, callback=positive,
    help="Seconds workers (and the job's own agents) train on while the driver is "
         "unreachable: within it a resumed driver (--resume) takes them back; past it they "
         "stop. (--driver-timeout: the same, its older name.)")
NETWORK_INTERFACE = click.option(
    "--network-interface", metavar="IFACE",
    help="Network interface for Gloo traffic between workers (GLOO_SOCKET_IFNAME); its "
         "address is also the driver's address given to remote hosts.")
OUTPUT_FILENAME = click.option(
    "--output-filename", type=click.Path(path_type=Path), metavar="DIR",
    help="Also append each rank's output to DIR/rank.N/stdout and .../stderr.")
PREFIX_OUTPUT_WITH_TIMESTAMP = click.option(
    "--prefix-output-with-timestamp", is_flag=True,
    help="Start each forwarded output line with a timestamp.")
EVENT_LOG = click.option(
    "--event-log", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
    help="Append each job event to FILE as one JSON line.")
TIMELINE_FILENAME = click.option(
    "--timeline-filename", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
    help="Write a timeline of the job (Chrome trace JSON: open it in Perfetto or "
         "chrome://tracing): a lane per worker and one for the driver. Written by the driver, "
         "on its host.")
TIMELINE_MARK_CYCLES = click.option(
    "--timeline-mark-cycles", is_flag=True,
    help="Mark each optimizer step in the timeline (an instant CYCLE event).")
LOG_LEVEL = click.option(
    "--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"],
                                     case_sensitive=False),
    default="INFO", show_default=True, help="Verbosity of elasticrun's own messages.")
VERBOSE = click.option("--verbose", "-v", is_flag=True, help="Same as --log-level DEBUG.")

# Those torchrun's form takes too (torchrun has no counterpart, nor a clashing name).
SHARED = (COLLECTIVE_TIMEOUT, HANG_DETECTION, HANG_TIMEOUT, STUCK_TIMEOUT, STRAGGLERS,
          INIT_TIMEOUT,
          BACKEND, DRIVER_GRACE, NETWORK_INTERFACE, OUTPUT_FILENAME,
          PREFIX_OUTPUT_WITH_TIMESTAMP, EVENT_LOG, TIMELINE_FILENAME, TIMELINE_MARK_CYCLES,
          LOG_LEVEL, VERBOSE)


def shared_options(function: F) -> F:
    """Decorates a command with SHARED, in that order."""
    for option in reversed(SHARED):
        function = option(function)
    return function
