"""torchrun's option values, read as torch 2.13's torchrun reads them (torch/distributed/
run.py: parse_min_max_nnodes, determine_local_world_size, Std.from_str), into
TorchrunArgs; the rendezvous values (--rdzv-conf, an endpoint): torchrun_rendezvous.py.
Pure: what the machine has comes in as Devices. Every value elasticrun cannot honour is
refused here, as one ConfigError line naming the flag and what it expects.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elasticrun.cli.torchrun_rendezvous import RdzvConf, parse_rdzv_conf, parse_seconds
from elasticrun.driver.processes.output import EVERY_LOCAL_RANK, Streams
from elasticrun.job.config import TorchrunSettings
from elasticrun.job.errors import ConfigError

BACKENDS = ("c10d", "static")
# torchrun's prefix of a teed line (its TailLog's `[{role}{local_rank}]:`), unless
# TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE gives another
LINE_PREFIX = "[${role_name}${local_rank}]:"
LINE_PREFIX_VARIABLE = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
# torchrun's --signals-to-handle default; SIGINT and SIGTERM stop an elasticrun job anyway
DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_STD_VALUE = re.compile(r"^[0123]$")
_STD_MAPPING = re.compile(r"^(\d:[0123],)*(\d:[0123])$")
_STD_STREAMS: dict[str, tuple[str, ...]] = {
    "0": (), "1": ("stdout",), "2": ("stderr",), "3": ("stdout", "stderr")}


@dataclass(frozen=True)
class Devices:
    gpus: int
    cpus: int


@dataclass(frozen=True)
class TorchrunArgs:
    command: tuple[str, ...]
    nproc: int
    min_nodes: int
    max_nodes: int
    standalone: bool
    backend: str  # c10d or static
    endpoint: str  # --rdzv-endpoint as given ("": none)
    run_id: str  # --rdzv-id as given ("none": torchrun's default)
    rdzv: RdzvConf
    node_rank: int | None  # None: not given
    master_addr: str
    master_port: int | None
    local_addr: str | None
    max_restarts: int
    shutdown_timeout: float | None
    signals: tuple[signal.Signals, ...]  # those that stop the job beyond SIGINT, SIGTERM
    settings: TorchrunSettings
    own: Mapping[str, Any] = field(default_factory=dict)  # elasticrun's own options
    notes: tuple[str, ...] = ()  # warnings, as torchrun gives them


def parse_args(options: Mapping[str, Any], devices: Devices, python: str,
               environ: Mapping[str, str]) -> TorchrunArgs:
    """The torchrun command's click values -> TorchrunArgs (ConfigError: one line)."""
    o = dict(options)
    _refuse_unsupported(o)
    min_nodes, max_nodes = parse_nnodes(o["nnodes"])
    backend = str(o["rdzv_backend"])
    if backend in ("etcd", "etcd-v2"):
        raise ConfigError(f"--rdzv-backend {backend}: elasticrun runs its own rendezvous (its "
                          f"driver, on the node that owns --rdzv-endpoint); use c10d")
    if backend not in BACKENDS:
        raise ConfigError(f"--rdzv-backend {backend!r}: expected c10d or static")
    rdzv, notes = parse_rdzv_conf(str(o["rdzv_conf"] or ""))
    if o["node_rank"] not in (None, 0) and backend != "static":
        notes.append(f"--node-rank is only used for the static rendezvous backend; it is "
                     f"ignored for --rdzv-backend {backend}")
    settings = TorchrunSettings(
        run_id=None if o["rdzv_id"] == "none" else str(o["rdzv_id"]),
        role=str(o["role"]),
        log_dir=Path(o["log_dir"]) if o["log_dir"] else None,
        redirects=parse_std("-r/--redirects", str(o["redirects"])),
        tee=parse_std("-t/--tee", str(o["tee"])),
        local_ranks_filter=parse_local_ranks(str(o["local_ranks_filter"] or "")),
        virtual_local_rank=bool(o["virtual_local_rank"]),
        line_prefix=environ.get(LINE_PREFIX_VARIABLE) or LINE_PREFIX)
    shutdown = o["shutdown_timeout"]
    if shutdown is None and environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"):
        shutdown = parse_seconds("TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
                           environ["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"], whole=True)
    if shutdown is not None and shutdown < 0:
        raise ConfigError(f"--shutdown-timeout must be 0 or more seconds, got {shutdown}")
    return TorchrunArgs(
        command=build_command(o, python), nproc=parse_nproc(str(o["nproc_per_node"]), devices),
        min_nodes=min_nodes, max_nodes=max_nodes, standalone=bool(o["standalone"]),
        backend=backend, endpoint=str(o["rdzv_endpoint"] or "").strip(),
        run_id=str(o["rdzv_id"]), rdzv=rdzv,
        node_rank=o["node_rank"], master_addr=str(o["master_addr"]),
        master_port=o["master_port"], local_addr=o["local_addr"] or None,
        max_restarts=int(o["max_restarts"]),
        shutdown_timeout=float(shutdown) if shutdown is not None else None,
        signals=parse_signals(str(o["signals_to_handle"])), settings=settings,
        notes=tuple(notes))


def _refuse_unsupported(o: Mapping[str, Any]) -> None:
    if o.get("logs_specs") not in (None, "default"):  # torch's own spec: as without the flag
        raise ConfigError(f"--logs-specs {o['logs_specs']!r}: torchrun's log-spec plugins do "
                          f"not apply (only its own, default); elasticrun keeps output with "
                          f"--log-dir, --redirects, --tee and --local-ranks-filter")
    if o.get("numa_binding") is not None:
        raise ConfigError(f"--numa-binding {o['numa_binding']}: not supported; bind workers "
                          f"in the script (os.sched_setaffinity) or with numactl --no-python")
    for flag, key in (("--duplicate-stdout-filters", "duplicate_stdout_filters"),
                      ("--duplicate-stderr-filters", "duplicate_stderr_filters")):
        if o.get(key) is not None:
            raise ConfigError(f"{flag} {o[key]!r}: not supported; --tee or --redirects with "
                              f"--log-dir keep each rank's whole output in files")


def parse_nnodes(value: str) -> tuple[int, int]:
    """`N` or `MIN:MAX`, 0 < MIN <= MAX."""
    parts = value.split(":")
    try:
        numbers = [int(part) for part in parts]
    except ValueError:
        numbers = []
    if len(numbers) not in (1, 2) or not 0 < numbers[0] <= numbers[-1]:
        raise ConfigError(f"--nnodes {value!r}: expected N or MIN:MAX, with 0 < MIN <= MAX")
    return numbers[0], numbers[-1]


def parse_nproc(value: str, devices: Devices) -> int:
    """A number, or what this node has: gpu (its GPUs), cpu (its CPUs), auto (its GPUs if
    any, else its CPUs)."""
    try:
        count = int(value)
    except ValueError:
        pass
    else:
        if count < 1:
            raise ConfigError(f"--nproc-per-node {value}: expected at least 1")
        return count
    if value == "gpu":
        if devices.gpus < 1:
            raise ConfigError("--nproc-per-node gpu: this node has no GPU (none in "
                              "CUDA_VISIBLE_DEVICES or /proc/driver/nvidia/gpus)")
        return devices.gpus
    if value == "cpu":
        return devices.cpus
    if value == "auto":
        return devices.gpus or devices.cpus
    if value == "xpu":
        raise ConfigError("--nproc-per-node xpu: elasticrun runs CUDA and CPU workers; give a "
                          "number")
    raise ConfigError(f"--nproc-per-node {value!r}: expected a number, gpu, cpu or auto")


def parse_std(flag: str, value: str) -> Streams:
    """torchrun's Std: `0`..`3` for every local rank (1 stdout, 2 stderr, 3 both), or
    `LOCAL_RANK:0..3,...`; the local ranks and streams it names."""
    if _STD_VALUE.match(value):
        streams = _STD_STREAMS[value]
        return ((EVERY_LOCAL_RANK, streams),) if streams else ()
    if _STD_MAPPING.match(value):
        table: dict[int, tuple[str, ...]] = {}
        for item in value.split(","):
            rank, std = item.split(":")
            table[int(rank)] = _STD_STREAMS[std]
        return tuple((rank, streams) for rank, streams in table.items() if streams)
    raise ConfigError(f"{flag} {value!r}: expected 0, 1 (stdout), 2 (stderr) or 3 (both), "
                      f"or LOCAL_RANK:0-3 pairs, e.g. 0:1,1:2")


def parse_local_ranks(value: str) -> frozenset[int] | None:
    if not value:
        return None
    try:
        ranks = frozenset(int(item) for item in value.split(","))
    except ValueError:
        raise ConfigError(f"--local-ranks-filter {value!r}: expected local ranks separated "
                          f"by commas, e.g. 0,1,2") from None
    return ranks


def parse_signals(value: str) -> tuple[signal.Signals, ...]:
    """--signals-to-handle: every listed signal stops the job, as SIGTERM does."""
    found = []
    for name in (item.strip().upper() for item in value.split(",") if item.strip()):
        try:
            sig = signal.Signals[name if name.startswith("SIG") else "SIG" + name]
        except KeyError:
            raise ConfigError(f"--signals-to-handle: unknown signal {name!r}") from None
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            raise ConfigError(f"--signals-to-handle: {sig.name} cannot be handled")
        if sig not in STOPPING_SIGNALS and sig not in found:
            found.append(sig)
    return tuple(found)


def build_command(o: Mapping[str, Any], python: str) -> tuple[str, ...]:
    """What each worker runs: `python SCRIPT ARGS`, `python -m MODULE ARGS`, or with
    --no-python `SCRIPT ARGS`; --run-path runs the script with Python whatever else is said
    (torchrun's order)."""
    script, rest = str(o["script"]), tuple(str(arg) for arg in o["script_args"])
    if o["run_path"]:
        return (python, script, *rest)
    if o["no_python"]:
        if o["module"]:
            raise ConfigError("--no-python and -m/--module: give one (torchrun refuses both)")
        return (script, *rest)
    if o["module"]:
        return (python, "-m", script, *rest)
    return (python, script, *rest)
