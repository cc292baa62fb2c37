"""The `elasticrun` command: click options -> DriverConfig -> asyncio.run(Driver.run())."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from pathlib import Path

import click

from elasticrun import protocol
from elasticrun.config import BACKENDS
from elasticrun.config_file import config_file_callback
from elasticrun.driver.driver import Driver
from elasticrun.driver.journal import command_line
from elasticrun.driver.journal.opening import refuse_a_running_job
from elasticrun.driver.processes.output import OutputRouter
from elasticrun.errors import ConfigError, DiscoveryError, ElasticrunError
from elasticrun.job_config import build_config, build_parts
from elasticrun.process_setup import raise_open_file_limit, setup_logging

ENV_WEBHOOK_TOKEN = protocol.ENV_WEBHOOK_TOKEN
ENV_EVENT_SECRET = protocol.ENV_EVENT_SECRET
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _positive(_ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and value <= 0:
        raise click.BadParameter(f"must be positive, got {value}")
    return value


@click.command(context_settings={**CONTEXT, "allow_interspersed_args": False})
@click.option("--config-file", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              is_eager=True, expose_value=False, callback=config_file_callback,
              help="YAML file with the same keys as these flags (e.g. 'min-np: 2'); "
                   "flags given on the command line override it.")
@click.option("-np", "--num-proc", "np", type=click.IntRange(min=1),
              help="Number of worker processes to start with [default: --min-np, or all slots "
                   "of -H].")
@click.option("--min-np", "--min-num-proc", "min_np", type=click.IntRange(min=1),
              help="Fewest workers the job may run with; makes the job elastic.")
@click.option("--max-np", "--max-num-proc", "max_np", type=click.IntRange(min=1),
              help="Most workers the job may grow to [default: -np, or no limit when elastic].")
@click.option("-H", "--hosts", "hosts", metavar="HOST:SLOTS,...",
              help="Fixed host list, e.g. 'node1:4,node2:4'. Default: localhost:<np>.")
@click.option("--hostfile", type=click.Path(path_type=Path),
              help="File with one 'host:slots' or 'host slots=N' per line; re-read while running.")
@click.option("--host-discovery-script", "discovery_script", type=click.Path(path_type=Path),
              help="Executable printing the current hosts, one 'host:slots' per line.")
@click.option("--discovery", "discovery", metavar="NAME[:ARG]",
              help="Discovery plugin: script:PATH, static:HOSTS, hostfile:PATH, webhook[:HOSTS], "
                   "an installed plugin's NAME[:ARG], or module.path:factory[:ARG].")
@click.option("--launcher", "launcher", metavar="NAME[:ARG]", default="auto",
              show_default=True, envvar="ELASTICRUN_LAUNCHER",
              help="How workers start: auto (local for this machine's names, SSH for the "
                   "rest), local, ssh, slurm (srun, inside an allocation), agent (through "
                   "`elasticrun agent`s that connect to this driver), an installed "
                   "launcher's NAME[:ARG], or module.path:factory[:ARG].")
@click.option("--agent-token-file", type=click.Path(path_type=Path, dir_okay=False),
              metavar="FILE", help="Token that `elasticrun agent`s authenticate with "
                                   "(--launcher agent, --discovery agents). Or set "
                                   "ELASTICRUN_AGENT_TOKEN.")
@click.option("--discovery-interval", type=float, default=1.0, show_default=True,
              callback=_positive, help="Seconds between discovery polls.")
@click.option("--discovery-timeout", type=float, default=10.0, show_default=True,
              callback=_positive, help="Seconds a discovery script may run before it is killed.")
@click.option("--slots-per-host", type=click.IntRange(min=1),
              help="Slots of a host listed without a count [default: 1].")
@click.option("--start-timeout", type=float, default=30.0, show_default=True, callback=_positive,
              help="Seconds to wait for -np slots at start, and for all workers of a round "
                   "to check in.")
@click.option("--elastic-timeout", type=float, default=600.0, show_default=True,
              callback=_positive, help="Seconds to wait for --min-np slots after a failure.")
@click.option("--reset-limit", type=click.IntRange(min=0),
              help="Most resets (rounds after the first) the job may take [default: no limit].")
@click.option("--blacklist-cooldown-range", type=(float, float), metavar="MIN MAX",
              help="A failed host may return after a growing cooldown of MIN..MAX seconds "
                   "[default: failed hosts never return].")
@click.option("--collective-timeout", type=float, default=60.0, show_default=True,
              callback=_positive, help="Seconds a collective may block before it counts "
                                       "as a failure.")
@click.option("--hang-detection/--no-hang-detection", default=True, show_default=True,
              help="Find a hung worker (stopped, frozen host, cut link) in about a second, "
                   "instead of at the collective timeout: a collective that waits far longer "
                   "than usual makes the driver probe the round's members.")
@click.option("--hang-timeout", type=float, default=5.0, show_default=True,
              callback=_positive, help="Seconds a worker that answers no probe is given when "
                                       "its host cannot say whether its process runs "
                                       "(launchers without process states).")
@click.option("--stuck-timeout", type=float, default=30.0, show_default=True,
              callback=_positive, help="Seconds a worker's training thread may stay outside "
                                       "collectives, using no CPU, while its peers wait in "
                                       "one (a deadlocked data loader) before it counts as "
                                       "hung.")
@click.option("--backend", type=click.Choice(BACKENDS), default="auto",
              show_default=True, envvar="ELASTICRUN_BACKEND", show_envvar=True,
              help="What carries CUDA tensors: nccl, gloo (through host memory), or auto "
                   "(NCCL where every worker has a GPU and torch has NCCL). CPU tensors "
                   "always travel on Gloo.")
@click.option("--driver-grace", "--driver-timeout", "driver_timeout", type=float,
              default=300.0, show_default=True, callback=_positive,
              help="Seconds workers (and the job's own agents) train on while the driver is "
                   "unreachable: within it a resumed driver (--resume) takes them back; past "
                   "it they stop. (--driver-timeout: the same, its older name.)")
@click.option("-p", "--ssh-port", "ssh_port", type=click.IntRange(1, 65535),
              help="SSH port of remote hosts [default: from ~/.ssh/config, else 22].")
@click.option("-i", "--ssh-identity-file", "ssh_identity_file",
              type=click.Path(path_type=Path), metavar="FILE",
              help="Private key for SSH [default: ~/.ssh/config, the agent, ~/.ssh keys].")
@click.option("--ssh-accept-new-host-keys", is_flag=True,
              help="Accept and record unknown SSH host keys (a changed key is always "
                   "refused).")
@click.option("--remote-python", metavar="PATH",
              help="Python interpreter that starts workers on SSH hosts "
                   "[default: this interpreter's path].")
@click.option("--working-dir", type=click.Path(path_type=Path), metavar="DIR",
              help="Directory workers run in, locally and on SSH hosts [default: the "
                   "current directory].")
@click.option("--network-interface", metavar="IFACE",
              help="Network interface for Gloo traffic between workers (GLOO_SOCKET_IFNAME).")
@click.option("--output-filename", type=click.Path(path_type=Path), metavar="DIR",
              help="Also append each rank's output to DIR/rank.N/stdout and .../stderr.")
@click.option("--prefix-output-with-timestamp", is_flag=True,
              help="Start each forwarded output line with a timestamp.")
@click.option("--port", type=click.IntRange(0, 65535), default=0,
              help="Port of the driver's server (workers, webhook, /status, /metrics) "
                   "[default: any free port].")
@click.option("--bind", "bind", multiple=True, metavar="ADDR",
              help="Address the driver listens on (repeatable; 0.0.0.0 for all, with a "
                   "warning) [default: loopback and the addresses that reach the hosts].")
@click.option("--webhook-token-file", type=click.Path(path_type=Path, dir_okay=False),
              metavar="FILE", help="Turns on the host-change webhook (/v1/hosts); requests "
                                   "must carry this bearer token. Or set "
                                   "ELASTICRUN_WEBHOOK_TOKEN.")
@click.option("--event-webhook", "event_webhooks", multiple=True, metavar="URL",
              help="POST each job event as signed JSON to URL (repeatable).")
@click.option("--event-secret-file", type=click.Path(path_type=Path, dir_okay=False),
              metavar="FILE", help="Key that signs --event-webhook posts (HMAC-SHA256). Or set "
                                   "ELASTICRUN_EVENT_SECRET.")
@click.option("--state-dir", type=click.Path(path_type=Path, file_okay=False), metavar="DIR",
              help="Keep the job's journal in DIR (what a restarted driver needs to take the "
                   "running workers back): the rounds, members, ranks, hosts and failures, "
                   "rewritten after each change. Files 0600.")
@click.option("--resume", is_flag=True,
              help="Take the job kept in --state-dir back after its driver was lost: the "
                   "same command line plus --resume. Its running workers are re-adopted "
                   "(waiting up to --start-timeout for them) instead of restarted.")
@click.option("--event-log", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="Append each job event to FILE as one JSON line.")
@click.option("--timeline-filename", type=click.Path(path_type=Path, dir_okay=False),
              metavar="FILE", help="Write a timeline of the job (Chrome trace JSON: open it in "
                                   "Perfetto or chrome://tracing): a lane per worker and one "
                                   "for the driver. Written by the driver, on its host.")
@click.option("--timeline-mark-cycles", is_flag=True,
              help="Mark each optimizer step in the timeline (an instant CYCLE event).")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"],
                                               case_sensitive=False),
              default="INFO", show_default=True, help="Verbosity of elasticrun's own messages.")
@click.option("--verbose", "-v", is_flag=True, help="Same as --log-level DEBUG.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED,
                metavar="COMMAND [ARGS]...")
@click.version_option(package_name="elasticrun")
def cli(**options: object) -> None:
    """Runs COMMAND as an elastic data-parallel job.

    \b
    Examples:
      elasticrun -np 2 python train.py
      elasticrun -np 4 -H node1:2,node2:2 python train.py
      elasticrun -np 4 --min-np 2 --host-discovery-script ./hosts.sh python train.py
      elasticrun --min-np 2 --launcher agent --port 29400 --agent-token-file t python train.py

    Also: `elasticrun status URL` (a running job) and `elasticrun agent` (a node's agent).
    """
    verbose = bool(options.pop("verbose"))
    level = "DEBUG" if verbose else str(options.pop("log_level")).upper()
    options.pop("log_level", None)
    setup_logging(level)
    timeline = {"timeline_filename": options.pop("timeline_filename", None),
                "timeline_mark_cycles": bool(options.pop("timeline_mark_cycles", False))}
    config = build_config(**options)  # type: ignore[arg-type]
    config = dataclasses.replace(config, **timeline)  # type: ignore[arg-type]
    if config.state_dir is not None and not config.resume:
        refuse_a_running_job(config.state_dir)
        command_line.record(config.state_dir, click.get_current_context().obj or [],
                            Path.cwd())
    parts = build_parts(config)
    raise_open_file_limit()
    output = OutputRouter(sys.stdout.buffer, sys.stderr.buffer, config.output_filename,
                          config.prefix_timestamp)
    try:
        code = asyncio.run(Driver(config, parts, output).run())
    finally:
        output.close()
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Entry point: every error the user can cause ends as one line on stderr, no traceback."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args[:1] == ["status"]:  # `elasticrun -- status` runs a program named status
            # (imported here, as the agent's: a job's own start needs neither)
            from elasticrun.status_cli import status_command

            status_command.main(args=args[1:], prog_name="elasticrun status",
                                standalone_mode=False)
            return
        if args[:1] == ["agent"]:  # likewise `elasticrun -- agent`
            from elasticrun.agent.cli import agent_command

            agent_command.main(args=args[1:], prog_name="elasticrun agent",
                               standalone_mode=False)
            return
        if (kept := command_line.short_resume(args)) is not None:
            args, cwd = command_line.recall(kept)  # the job as it started, from where
            os.chdir(cwd)
        cli.main(args=args, prog_name="elasticrun", standalone_mode=False, obj=args)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"elasticrun: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except (ConfigError, DiscoveryError) as exc:
        click.echo(f"elasticrun: error: {exc}", err=True)
        sys.exit(2)
    except ElasticrunError as exc:
        click.echo(f"elasticrun: error: {exc}", err=True)
        sys.exit(1)
    except click.Abort:
        click.echo("elasticrun: aborted", err=True)
        sys.exit(130)
