"""elasticrun's own form, horovodrun's: `elasticrun -np 2 python train.py`; click options ->
DriverConfig -> the driver (job.py)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import click

from elasticrun import __version__
from elasticrun.api.job_config import build_config
from elasticrun.cli.config_file import config_file_callback
from elasticrun.cli.job import run_job
from elasticrun.cli.options import (
    BACKEND,
    COLLECTIVE_TIMEOUT,
    CONTEXT,
    DRIVER_GRACE,
    EVENT_LOG,
    HANG_DETECTION,
    HANG_TIMEOUT,
    INIT_TIMEOUT,
    LOG_LEVEL,
    NETWORK_INTERFACE,
    OUTPUT_FILENAME,
    PREFIX_OUTPUT_WITH_TIMESTAMP,
    STRAGGLERS,
    STUCK_TIMEOUT,
    TIMELINE_FILENAME,
    TIMELINE_MARK_CYCLES,
    VERBOSE,
    positive,
)
from elasticrun.job.config import DEFAULT_CHECKPOINT_INTERVAL_S, DEFAULT_MAX_RESTARTS
from elasticrun.system.process_setup import setup_logging


@click.command(context_settings={**CONTEXT, "allow_interspersed_args": False})
@click.option("--config-file", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              is_eager=True, expose_value=False, callback=config_file_callback,
              help="YAML file with the same keys as these flags (e.g. 'min-np: 2'); "
                   "flags given on the command line override it.")
@click.option("-np", "--num-proc", "np", type=click.IntRange(min=1),
              help="Number of worker processes to start with [default: --min-np, or all slots "
                   "of -H that fill whole replica groups of --shard-size].")
@click.option("--min-np", "--min-num-proc", "min_np", type=click.IntRange(min=1),
              help="Fewest workers the job may run with; makes the job elastic.")
@click.option("--max-np", "--max-num-proc", "max_np", type=click.IntRange(min=1),
              help="Most workers the job may grow to [default: -np, or no limit when elastic].")
@click.option("--shard-size", type=click.IntRange(min=1), default=1, show_default=True,
              metavar="S",
              help="Workers per replica group (elastic HSDP): every round is made of groups "
                   "of S consecutive ranks on one host, so a host gives its slots in "
                   "multiples of S (the rest stay unused) and a lost host takes whole groups "
                   "with it. -np, --min-np and --max-np must be multiples of S.")
@click.option("-H", "--hosts", "hosts", metavar="HOST:SLOTS,...",
              help="Fixed host list, e.g. 'node1:4,node2:4'. Default: localhost:<np>.")
@click.option("--hostfile", type=click.Path(path_type=Path),
              help="File with one 'host:slots' or 'host slots=N' per line; re-read while running.")
@click.option("--host-discovery-script", "discovery_script", type=click.Path(path_type=Path),
              help="Executable printing the current hosts, one 'host:slots' per line.")
@click.option("--discovery", "discovery", metavar="NAME[:ARG]",
              help="Discovery plugin: script:PATH, static:HOSTS, hostfile:PATH, webhook[:HOSTS], "
                   "slurm[:SLOTS], agents, an installed plugin's NAME[:ARG], or "
                   "module.path:factory[:ARG].")
@click.option("--launcher", "launcher", metavar="NAME[:ARG]", default="auto",
              show_default=True, envvar="ELASTICRUN_LAUNCHER", show_envvar=True,
              help="How workers start: auto (local for this machine's names, SSH for the "
                   "rest), local, ssh, slurm (srun, inside an allocation), agent (through "
                   "`elasticrun agent` processes that connect to this driver), an installed "
                   "launcher's NAME[:ARG], or module.path:factory[:ARG].")
@click.option("--agent-token-file", type=click.Path(path_type=Path, dir_okay=False),
              metavar="FILE", help="Token that `elasticrun agent` processes authenticate with "
                                   "(--launcher agent, --discovery agents). Or set "
                                   "ELASTICRUN_AGENT_TOKEN.")
@click.option("--discovery-interval", type=float, default=1.0, show_default=True,
              callback=positive, help="Seconds between discovery polls.")
@click.option("--discovery-timeout", type=float, default=10.0, show_default=True,
              callback=positive, help="Seconds a discovery script may run before it is killed (a "
              "plugin's call is cut 5 s later).")
@click.option("--slots-per-host", type=click.IntRange(min=1),
              help="Slots of a host listed without a count [default: 1].")
@click.option("--start-timeout", type=float, default=30.0, show_default=True, callback=positive,
              help="Seconds to wait for -np slots at start; with --collective-timeout, it "
                   "also bounds a round no member joins (a worker's first er.init() has "
                   "--init-timeout).")
@click.option("--elastic-timeout", type=float, default=600.0, show_default=True,
              callback=positive, help="Seconds to wait for --min-np slots after a failure.")
@click.option("--reset-limit", type=click.IntRange(min=0),
              help="Most resets (rounds after the first) the job may take [default: no limit].")
@click.option("--max-restarts", type=click.IntRange(min=0), default=DEFAULT_MAX_RESTARTS,
              show_default=True,
              help="Restarts, after a failure, of a round of scripts that never call er.init() "
                   "(torchrun-style scripts: the whole round restarts, as under torchrun), and "
                   "of a job that lost every worker holding its commit (it restarts from the "
                   "newest kept commit).")
@click.option("--host-snapshots/--no-host-snapshots", default=True, show_default=True,
              help="Keep each commit of a TorchState in each host's memory (/dev/shm), written "
                   "off the training thread: a job that loses every worker goes on from it. "
                   "Costs two copies of the state per host.")
@click.option("--checkpoint-dir", type=click.Path(path_type=Path, file_okay=False),
              metavar="DIR",
              help="Also write commits to DIR (asynchronously, atomically, fsynced), where a "
                   "total loss or the same command run again resumes from the newest.")
@click.option("--checkpoint-interval", type=click.FloatRange(min=0),
              default=DEFAULT_CHECKPOINT_INTERVAL_S, show_default=True, metavar="SECONDS",
              help="Write a commit to --checkpoint-dir at most once every SECONDS (0: every "
                   "commit; the newest wins while a write is in flight).")
@INIT_TIMEOUT
@click.option("--blacklist-cooldown-range", type=(float, float), metavar="MIN MAX",
              help="A blacklisted slot or host (its workers kept failing, or it stopped "
                   "answering) returns after a growing cooldown of MIN..MAX seconds "
                   "[default: 10 300].")
@click.option("--permanent-blacklist", is_flag=True,
              help="Blacklisted slots and hosts never return (Horovod's default).")
@COLLECTIVE_TIMEOUT
@HANG_DETECTION
@HANG_TIMEOUT
@STUCK_TIMEOUT
@STRAGGLERS
@BACKEND
@DRIVER_GRACE
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
@NETWORK_INTERFACE
@OUTPUT_FILENAME
@PREFIX_OUTPUT_WITH_TIMESTAMP
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
@EVENT_LOG
@TIMELINE_FILENAME
@TIMELINE_MARK_CYCLES
@LOG_LEVEL
@VERBOSE
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED,
                metavar="COMMAND [ARGS]...")
@click.version_option(__version__, message="%(prog)s %(version)s")
def cli(**options: object) -> None:
    """Runs COMMAND as an elastic data-parallel job.

    \b
    Examples:
      elasticrun -np 2 python train.py
      elasticrun -np 4 -H node1:2,node2:2 python train.py
      elasticrun -np 4 --min-np 2 --host-discovery-script ./hosts.sh python train.py
      elasticrun --min-np 2 --launcher agent --port 29400 --agent-token-file t python train.py

    torchrun's form works too: `elasticrun --nproc-per-node 2 train.py` (torchrun's flags,
    the script without `python`). It is chosen when a torchrun-only flag comes before the
    command; else, when no option only this form has is given, when PET_NPROC_PER_NODE or
    PET_NNODES is set or the command is a `.py` file. `elasticrun --nproc-per-node 1
    --help` lists it.

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
    sys.exit(run_job(config, click.get_current_context().obj or []))
