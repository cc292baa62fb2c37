"""torchrun's form: `elasticrun --nproc-per-node 2 train.py` does what `torchrun
--nproc-per-node 2 train.py` does. Every flag of torch 2.13's torchrun, in each of its
spellings (dashes and underscores, `=` or a space, any unambiguous prefix: abbrev.py), its
default from PET_<NAME> as torchrun's own (Kubeflow's PyTorchJob sets them), then SCRIPT
[ARGS] without `python`.
What elasticrun does with each: docs/migrating/torchrun.md. The values: torchrun_args.py
(its rendezvous's: torchrun_rendezvous.py); what runs on this node: torchrun_plan.py and
torchrun_launch.py.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from elasticrun import __version__
from elasticrun.cli.abbrev import AbbreviatingCommand
from elasticrun.cli.machine import cpu_count, gpu_count
from elasticrun.cli.options import CONTEXT, shared_options
from elasticrun.cli.torchrun_args import DEFAULT_SIGNALS, Devices, TorchrunArgs, parse_args
from elasticrun.cli.torchrun_launch import launch
from elasticrun.system.process_setup import setup_logging

F = TypeVar("F", bound=Callable[..., Any])
# elasticrun's own options that torchrun's form takes too (options.SHARED) and that go
# to the driver's config as they are
OWN_OPTIONS = ("collective_timeout", "hang_detection", "hang_timeout", "stuck_timeout",
               "stragglers",
               "init_timeout", "backend", "driver_timeout", "network_interface",
               "output_filename", "prefix_output_with_timestamp", "event_log")
# Accepted, for what elasticrun does differently (docs/migrating/torchrun.md says what)
ACCEPTED_ONLY = ("monitor_interval", "start_method", "event_log_handler")


class TorchrunOption(click.Option):
    """One of torchrun's own options. A switch's PET_ variable takes any whole number, as
    torchrun's `check_env` reads it (`bool(int(value))`: PET_STANDALONE=2 is on), besides
    click's true/false."""

    def resolve_envvar_value(self, ctx: click.Context) -> str | None:
        value = super().resolve_envvar_value(ctx)
        if value is None or not self.is_flag:
            return value
        try:
            return "1" if int(value) else "0"
        except ValueError:
            return value


def pet(*names: str, **kwargs: Any) -> Callable[[F], F]:
    """A torchrun option, defaulting to PET_<NAME> (torchrun's `env`/`check_env`)."""
    dest = names[-1]
    return click.option(*names[:-1], dest, cls=TorchrunOption, envvar=f"PET_{dest.upper()}",
                        show_envvar=True, **kwargs)


@click.command(cls=AbbreviatingCommand,
               context_settings={**CONTEXT, "allow_interspersed_args": False},
               epilog="elasticrun's own options taken in this form too: "
                      "--collective-timeout, --hang-detection/--no-hang-detection, "
                      "--hang-timeout, --stuck-timeout, --stragglers, --init-timeout, --backend, "
                      "--driver-grace, --network-interface, --output-filename, "
                      "--prefix-output-with-timestamp, --event-log, --timeline-filename, "
                      "--timeline-mark-cycles, --log-level, -v/--verbose (see `elasticrun "
                      "--help`). Every torchrun flag and what elasticrun does with it: "
                      "docs/migrating/torchrun.md.")
@pet("--nnodes", "nnodes", default="1:1", show_default=True, metavar="N|MIN:MAX",
     help="Number of nodes (launchers), or the range MIN:MAX: MIN nodes, then up to MAX "
          "within --rdzv-conf last_call_timeout.")
@pet("--nproc-per-node", "--nproc_per_node", "nproc_per_node", default="1", show_default=True,
     metavar="N|gpu|cpu|auto", help="Workers per node: a number, the node's GPUs, its CPUs, "
                                    "or auto (GPUs if any, else CPUs).")
@pet("--rdzv-backend", "--rdzv_backend", "rdzv_backend", default="static", show_default=True,
     help="c10d or static: either way elasticrun's driver is the rendezvous (etcd refused).")
@pet("--rdzv-endpoint", "--rdzv_endpoint", "rdzv_endpoint", default="", metavar="HOST:PORT",
     help="The launcher that binds HOST:PORT serves the job's driver there; every "
          "launcher's agent connects to it.")
@pet("--rdzv-id", "--rdzv_id", "rdzv_id", default="none", show_default=True,
     help="The job's id (TORCHELASTIC_RUN_ID); with no agent token, the nodes' token is "
          "derived from it.")
@pet("--rdzv-conf", "--rdzv_conf", "rdzv_conf", default="", metavar="KEY=VALUE,...",
     help="join_timeout (seconds nodes wait for MIN nodes, default 600), last_call_timeout "
          "(then for more, default 30), is_host, agent_token_file; torch's other keys are "
          "accepted and do nothing; any other key is ignored with a warning.")
@pet("--standalone", "standalone", is_flag=True, help="One node, its rendezvous its own.")
@pet("--max-restarts", "--max_restarts", "max_restarts", type=click.IntRange(min=0), default=0,
     show_default=True, help="Restarts of the workers after a failure before the job fails.")
@pet("--monitor-interval", "--monitor_interval", "monitor_interval", type=float, default=0.1,
     help="Accepted; elasticrun sees each exit at once.")
@pet("--start-method", "--start_method", "start_method", default="spawn",
     type=click.Choice(["spawn", "fork", "forkserver"]),
     help="Accepted; workers are forked from a template that imported torch, as forkserver.")
@pet("--event-log-handler", "--event_log_handler", "event_log_handler", default="null",
     help="Accepted; elasticrun's events go to --event-log FILE.")
@pet("--role", "role", default="default", show_default=True,
     help="The workers' role (ROLE_NAME).")
@pet("-m", "--module", "module", is_flag=True, help="Run SCRIPT as a module (python -m).")
@pet("--no-python", "--no_python", "no_python", is_flag=True,
     help="Run SCRIPT itself, not with python.")
@pet("--run-path", "--run_path", "run_path", is_flag=True,
     help="Run SCRIPT with runpy.run_path (what elasticrun's workers do anyway).")
@pet("--log-dir", "--log_dir", "log_dir", metavar="DIR",
     help="Keep what --redirects/--tee name in torchrun's layout: "
          "DIR/<run id>_<random>/attempt_<K>/<local rank>/stdout.log|stderr.log.")
@pet("-r", "--redirects", "redirects", default="0", metavar="STD",
     help="Streams kept in files instead of the console: 0-3 (1 stdout, 2 stderr, 3 both) "
          "for every local rank, or LOCAL_RANK:STD,... (e.g. 0:1,1:2).")
@pet("-t", "--tee", "tee", default="0", metavar="STD",
     help="Streams kept in files and shown on the console (as --redirects), each line "
          "prefixed [<role><local rank>]: or as TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE says.")
@pet("--local-ranks-filter", "--local_ranks_filter", "local_ranks_filter", default="",
     metavar="R,...", help="Show only these local ranks on the console (files keep all).")
@pet("--duplicate-stdout-filters", "--duplicate_stdout_filters", "duplicate_stdout_filters",
     metavar="WORDS", help="Refused (keep whole outputs with --tee and --log-dir).")
@pet("--duplicate-stderr-filters", "--duplicate_stderr_filters", "duplicate_stderr_filters",
     metavar="WORDS", help="Refused (as --duplicate-stdout-filters).")
@pet("--node-rank", "--node_rank", "node_rank", type=click.IntRange(min=0),
     help="The static form's node rank: node 0 hosts the job [default: 0].")
@pet("--master-addr", "--master_addr", "master_addr", default="127.0.0.1", show_default=True,
     help="The static form's endpoint host (without --rdzv-endpoint).")
@pet("--master-port", "--master_port", "master_port", type=click.IntRange(0, 65535),
     help="The static form's endpoint port [default: 29500].")
@pet("--local-addr", "--local_addr", "local_addr", metavar="NAME",
     help="This node's name in the job [default: $SLURMD_NODENAME, else the host name]; "
          "a second launcher of the job with that name on this machine is NAME_1, ...")
@click.option("--logs-specs", "--logs_specs", "logs_specs", cls=TorchrunOption, metavar="NAME",
              help="default: accepted (torchrun's own log spec, as without the flag); any "
                   "other: refused (torchrun's log-spec plugins do not apply).")
@click.option("--numa-binding", "--numa_binding", "numa_binding", cls=TorchrunOption,
              type=click.Choice(["node", "socket", "exclusive", "core-complex"]),
              help="Refused: not supported.")
@pet("--signals-to-handle", "--signals_to_handle", "signals_to_handle",
     default=DEFAULT_SIGNALS, show_default=True,
     help="Each stops the job as SIGTERM does (workers get SIGTERM, then SIGKILL).")
@pet("--shutdown-timeout", "--shutdown_timeout", "shutdown_timeout", type=int,
     help="Seconds between SIGTERM and SIGKILL when workers stop [default: "
          "$TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else elasticrun's 5].")
@pet("--virtual-local-rank", "--virtual_local_rank", "virtual_local_rank", is_flag=True,
     help="LOCAL_RANK=0 in every worker, CUDA_VISIBLE_DEVICES its own GPU.")
@shared_options
@click.argument("script", metavar="SCRIPT")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED, metavar="[ARGS]...")
@click.version_option(__version__, message="%(prog)s %(version)s")
def torchrun_cli(**options: Any) -> None:
    """Runs SCRIPT as torchrun does: `elasticrun` in place of `torchrun`, the rest of the
    line unchanged. Scripts that never call er.init() restart as a whole on a failure.

    \b
    Examples:
      elasticrun --standalone --nproc-per-node 4 train.py --epochs 3
      elasticrun --nproc_per_node=gpu -m my_package.train
      elasticrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
                 --rdzv-endpoint node1:29400 --rdzv-id job7 train.py    (on each node)

    This form is chosen when a torchrun-only option comes before SCRIPT; else, when no
    option only `elasticrun -np` has is given, when PET_NPROC_PER_NODE or PET_NNODES is
    set or SCRIPT ends in .py. Long options take any unambiguous prefix, as torchrun's
    (--redirect 3 is --redirects 3).
    """
    args, level, timeline = read_options(
        options, Devices(gpu_count(os.environ), cpu_count()), os.environ)
    setup_logging(level)
    sys.exit(launch(args, click.get_current_context().obj or [], level, timeline))


# torchrun's own options win a prefix they share with elasticrun's
torchrun_cli.preferred = frozenset(
    p.name for p in torchrun_cli.params if isinstance(p, TorchrunOption) and p.name)


def read_options(options: Mapping[str, Any], devices: Devices, environ: Mapping[str, str]
                 ) -> tuple[TorchrunArgs, str, dict[str, Any]]:
    """The command's values -> its arguments, elasticrun's log level, the timeline's
    options (ConfigError: one line)."""
    rest = dict(options)
    verbose, level = rest.pop("verbose"), str(rest.pop("log_level")).upper()
    level = "DEBUG" if verbose else level
    timeline = {"timeline_filename": rest.pop("timeline_filename"),
                "timeline_mark_cycles": bool(rest.pop("timeline_mark_cycles"))}
    own = {name: rest.pop(name) for name in OWN_OPTIONS if name in rest}
    for name in ACCEPTED_ONLY:
        rest.pop(name)
    args = parse_args(rest, devices, environ.get("PYTHON_EXEC", sys.executable), environ)
    return dataclasses.replace(args, own=own), level, timeline

