"""torchrun's form, its values: every flag's spellings through the real click command, the
PET_ defaults, and each value read as torch's torchrun reads it (tables), or refused in one
line."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import click
import pytest

from elasticrun.cli.machine import gpu_count
from elasticrun.cli.torchrun import read_options, torchrun_cli
from elasticrun.cli.torchrun_args import (
    Devices,
    TorchrunArgs,
    parse_local_ranks,
    parse_nnodes,
    parse_nproc,
    parse_signals,
    parse_std,
)
from elasticrun.cli.torchrun_rendezvous import RdzvConf, parse_endpoint, parse_rdzv_conf
from elasticrun.job.errors import ConfigError

DEVICES = Devices(gpus=2, cpus=8)
PY = "/usr/bin/python3"


@pytest.fixture(autouse=True)
def no_pet_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests' own PET_ variables only (a Kubeflow pod would have some)."""
    for name in [n for n in os.environ if n.startswith("PET_")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)


def params(*argv: str) -> dict[str, Any]:
    return dict(torchrun_cli.make_context("elasticrun", list(argv)).params)


def parsed(*argv: str, environ: dict[str, str] | None = None) -> TorchrunArgs:
    args, _, _ = read_options(params(*argv), DEVICES, {"PYTHON_EXEC": PY, **(environ or {})})
    return args


def refused(*argv: str, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parsed(*argv, environ=environ)
    message = str(info.value)
    assert message and "\n" not in message
    return message


# --- spellings: dashes and underscores, `=` or a space ----------------------------------------
SPELLINGS = [
    (["--nproc-per-node", "3"], "nproc_per_node", "3"),
    (["--nproc_per_node=3"], "nproc_per_node", "3"),
    (["--nproc_per_node", "gpu"], "nproc_per_node", "gpu"),
    (["--nnodes=1:4"], "nnodes", "1:4"),
    (["--rdzv-backend", "c10d"], "rdzv_backend", "c10d"),
    (["--rdzv_backend=c10d"], "rdzv_backend", "c10d"),
    (["--rdzv-endpoint=h:1"], "rdzv_endpoint", "h:1"),
    (["--rdzv_endpoint", "h:1"], "rdzv_endpoint", "h:1"),
    (["--rdzv-id", "j"], "rdzv_id", "j"),
    (["--rdzv_id=j"], "rdzv_id", "j"),
    (["--rdzv-conf", "is_host=1"], "rdzv_conf", "is_host=1"),
    (["--rdzv_conf=is_host=1"], "rdzv_conf", "is_host=1"),
    (["--standalone"], "standalone", True),
    (["--max-restarts", "2"], "max_restarts", 2),
    (["--max_restarts=2"], "max_restarts", 2),
    (["--monitor-interval", "1"], "monitor_interval", 1.0),
    (["--monitor_interval=1"], "monitor_interval", 1.0),
    (["--start-method", "fork"], "start_method", "fork"),
    (["--start_method=forkserver"], "start_method", "forkserver"),
    (["--event-log-handler", "x"], "event_log_handler", "x"),
    (["--event_log_handler=x"], "event_log_handler", "x"),
    (["--role", "trainer"], "role", "trainer"),
    (["-m"], "module", True),
    (["--module"], "module", True),
    (["--no-python"], "no_python", True),
    (["--no_python"], "no_python", True),
    (["--run-path"], "run_path", True),
    (["--run_path"], "run_path", True),
    (["--log-dir", "/l"], "log_dir", "/l"),
    (["--log_dir=/l"], "log_dir", "/l"),
    (["-r", "3"], "redirects", "3"),
    (["-r3"], "redirects", "3"),
    (["--redirects=0:1"], "redirects", "0:1"),
    (["-t", "1"], "tee", "1"),
    (["--tee=2"], "tee", "2"),
    (["--local-ranks-filter", "0"], "local_ranks_filter", "0"),
    (["--local_ranks_filter=0,1"], "local_ranks_filter", "0,1"),
    (["--duplicate-stdout-filters", "a"], "duplicate_stdout_filters", "a"),
    (["--duplicate_stderr_filters=a"], "duplicate_stderr_filters", "a"),
    (["--node-rank", "1"], "node_rank", 1),
    (["--node_rank=1"], "node_rank", 1),
    (["--master-addr", "a"], "master_addr", "a"),
    (["--master_addr=a"], "master_addr", "a"),
    (["--master-port", "7"], "master_port", 7),
    (["--master_port=7"], "master_port", 7),
    (["--local-addr", "n1"], "local_addr", "n1"),
    (["--local_addr=n1"], "local_addr", "n1"),
    (["--logs-specs", "x"], "logs_specs", "x"),
    (["--logs_specs=x"], "logs_specs", "x"),
    (["--numa-binding", "node"], "numa_binding", "node"),
    (["--numa_binding=socket"], "numa_binding", "socket"),
    (["--signals-to-handle", "SIGTERM"], "signals_to_handle", "SIGTERM"),
    (["--signals_to_handle=SIGUSR1"], "signals_to_handle", "SIGUSR1"),
    (["--shutdown-timeout", "9"], "shutdown_timeout", 9),
    (["--shutdown_timeout=9"], "shutdown_timeout", 9),
    (["--virtual-local-rank"], "virtual_local_rank", True),
    (["--virtual_local_rank"], "virtual_local_rank", True),
    # elasticrun's own options, taken in this form too
    (["--collective-timeout", "9"], "collective_timeout", 9.0),
    (["--no-hang-detection"], "hang_detection", False),
    (["--stragglers", "evict"], "stragglers", "evict"),
    (["--init-timeout=9"], "init_timeout", 9.0),
    (["--backend", "gloo"], "backend", "gloo"),
    (["--driver-grace", "9"], "driver_timeout", 9.0),
    (["-v"], "verbose", True),
]


@pytest.mark.parametrize(("argv", "dest", "value"), SPELLINGS)
def test_every_spelling_sets_its_option(argv: list[str], dest: str, value: Any) -> None:
    got = params(*argv, "train.py", "--lr", "1")
    assert got[dest] == value
    assert got["script"] == "train.py" and got["script_args"] == ("--lr", "1")


@pytest.mark.parametrize(("variable", "value", "dest", "expected"), [
    ("PET_NNODES", "2:3", "nnodes", "2:3"),
    ("PET_NPROC_PER_NODE", "4", "nproc_per_node", "4"),
    ("PET_RDZV_ENDPOINT", "m:5", "rdzv_endpoint", "m:5"),
    ("PET_RDZV_BACKEND", "c10d", "rdzv_backend", "c10d"),
    ("PET_RDZV_ID", "k", "rdzv_id", "k"),
    ("PET_MAX_RESTARTS", "3", "max_restarts", 3),
    ("PET_NODE_RANK", "1", "node_rank", 1),
    ("PET_MASTER_ADDR", "m", "master_addr", "m"),
    ("PET_MASTER_PORT", "23456", "master_port", 23456),
    ("PET_STANDALONE", "1", "standalone", True),
    ("PET_STANDALONE", "0", "standalone", False),
    ("PET_STANDALONE", "2", "standalone", True),  # torchrun's check_env: bool(int(value))
    ("PET_STANDALONE", " -1 ", "standalone", True),
    ("PET_STANDALONE", "00", "standalone", False),
    ("PET_STANDALONE", "true", "standalone", True),  # click's spellings besides
    ("PET_MODULE", "1", "module", True),
    ("PET_NO_PYTHON", "1", "no_python", True),
    ("PET_REDIRECTS", "3", "redirects", "3"),
    ("PET_TEE", "1", "tee", "1"),
    ("PET_LOG_DIR", "/l", "log_dir", "/l"),
    ("PET_ROLE", "r", "role", "r"),
])
def test_pet_variables_are_the_defaults(monkeypatch: pytest.MonkeyPatch, variable: str,
                                        value: str, dest: str, expected: Any) -> None:
    monkeypatch.setenv(variable, value)
    assert params("train.py")[dest] == expected


# --- abbreviations: any unambiguous prefix of a long option, as torchrun's argparse ---------
@pytest.mark.parametrize(("argv", "dest", "value"), [
    (["--redirect", "3"], "redirects", "3"),
    (["--redirect=3"], "redirects", "3"),
    (["--nproc", "2"], "nproc_per_node", "2"),  # both spellings of one flag: not ambiguous
    (["--nproc_per=2"], "nproc_per_node", "2"),
    (["--stand"], "standalone", True),
    (["--rdzv-e", "h:1"], "rdzv_endpoint", "h:1"),
    (["--rdzv_c=is_host=1"], "rdzv_conf", "is_host=1"),
    (["--max-r", "2"], "max_restarts", 2),
    (["--logs", "default"], "logs_specs", "default"),
    (["--log-d", "/l"], "log_dir", "/l"),  # torchrun's --log-dir wins over --log-level
    (["--v"], "virtual_local_rank", True),  # torchrun's flag wins over --verbose
    (["--coll", "9"], "collective_timeout", 9.0),  # elasticrun's own, by prefix too
])
def test_prefixes_name_their_option(argv: list[str], dest: str, value: Any) -> None:
    got = params(*argv, "train.py", "--redirect", "--v")
    assert got[dest] == value
    assert got["script_args"] == ("--redirect", "--v")  # the script's own: untouched


@pytest.mark.parametrize(("argv", "says"), [
    (["--n", "2"], "ambiguous option: --n could match --network-interface, --nnodes, "),
    (["--r", "x"], "ambiguous option: --r could match --rdzv-backend, --rdzv-conf, "),
    (["--hang", "1"], "--hang could match --hang-detection, --hang-timeout"),
])
def test_ambiguous_prefixes_are_refused_naming_the_options(argv: list[str], says: str) -> None:
    with pytest.raises(click.UsageError) as info:
        params(*argv, "train.py")
    assert says in info.value.format_message()


def test_logs_specs_default_is_torchruns_own() -> None:
    assert parsed("--logs-specs", "default", "t.py") == parsed("t.py")


def test_line_prefix() -> None:
    """torchrun's form prefixes a teed line as torchrun does, or as its variable says."""
    assert parsed("t.py").settings.line_prefix == "[${role_name}${local_rank}]:"
    environ = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]: "}
    assert parsed("t.py", environ=environ).settings.line_prefix == "[rank${rank}]: "


def test_a_flag_on_the_command_line_beats_its_pet_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_NPROC_PER_NODE", "4")
    assert params("--nproc-per-node", "2", "x.py")["nproc_per_node"] == "2"


def test_torchruns_defaults() -> None:
    args = parsed("train.py")
    assert (args.nproc, args.min_nodes, args.max_nodes) == (1, 1, 1)
    assert (args.backend, args.endpoint, args.run_id) == ("static", "", "none")
    assert args.max_restarts == 0 and args.master_port is None and args.node_rank is None
    assert args.settings.run_id is None and args.settings.role == "default"
    assert args.settings.redirects == () and args.settings.tee == ()
    assert args.signals == (signal.SIGHUP, signal.SIGQUIT)
    assert args.command == (PY, "train.py")


# --- the command --------------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "command"), [
    (["train.py", "--lr", "1"], (PY, "train.py", "--lr", "1")),
    (["-m", "pkg.train", "-x"], (PY, "-m", "pkg.train", "-x")),
    (["--no-python", "./run.sh", "a"], ("./run.sh", "a")),
    (["--run-path", "/abs/t.py"], (PY, "/abs/t.py")),
    (["--run-path", "--no-python", "/abs/t.py"], (PY, "/abs/t.py")),
    (["--run-path", "-m", "/abs/t.py"], (PY, "/abs/t.py")),
])
def test_the_command_each_worker_runs(argv: list[str], command: tuple[str, ...]) -> None:
    assert parsed(*argv).command == command


def test_python_exec_or_this_interpreter() -> None:
    args, _, _ = read_options(params("t.py"), DEVICES, {})
    assert args.command == (sys.executable, "t.py")


# --- values, as tables --------------------------------------------------------------------
@pytest.mark.parametrize(("value", "expected"), [
    ("1", (1, 1)), ("4", (4, 4)), ("1:1", (1, 1)), ("2:8", (2, 8))])
def test_nnodes(value: str, expected: tuple[int, int]) -> None:
    assert parse_nnodes(value) == expected


@pytest.mark.parametrize("value", ["0", "3:2", "a", "1:2:3", "", ":2", "-1"])
def test_nnodes_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="--nnodes"):
        parse_nnodes(value)


@pytest.mark.parametrize(("value", "devices", "expected"), [
    ("3", Devices(0, 8), 3), ("gpu", Devices(2, 8), 2), ("cpu", Devices(2, 8), 8),
    ("auto", Devices(2, 8), 2), ("auto", Devices(0, 8), 8)])
def test_nproc_per_node(value: str, devices: Devices, expected: int) -> None:
    assert parse_nproc(value, devices) == expected


@pytest.mark.parametrize(("value", "says"), [
    ("gpu", "no GPU"), ("xpu", "CUDA and CPU"), ("tpu", "expected a number"),
    ("0", "at least 1"), ("-2", "at least 1")])
def test_nproc_per_node_refused(value: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_nproc(value, Devices(0, 8))


@pytest.mark.parametrize(("environ", "present", "expected"), [
    ({}, 4, 4), ({}, None, 0), ({"CUDA_VISIBLE_DEVICES": "0,1"}, 4, 2),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2"}, None, 3), ({"CUDA_VISIBLE_DEVICES": ""}, 4, 0),
    ({"CUDA_VISIBLE_DEVICES": "1,-1,0"}, 4, 1), ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 2, 2),
    ({"CUDA_VISIBLE_DEVICES": "GPU-ab12,GPU-cd34"}, 8, 2)])
def test_gpus_are_counted_without_torch(tmp_path: Path, environ: dict[str, str],
                                        present: int | None, expected: int) -> None:
    gpus = tmp_path / "gpus"
    if present is not None:
        for i in range(present):
            (gpus / f"0000:0{i}:00.0").mkdir(parents=True)
    assert gpu_count(environ, gpus) == expected


@pytest.mark.parametrize(("value", "expected"), [
    ("0", ()),
    ("1", ((-1, ("stdout",)),)),
    ("2", ((-1, ("stderr",)),)),
    ("3", ((-1, ("stdout", "stderr")),)),
    ("0:1,1:2", ((0, ("stdout",)), (1, ("stderr",)))),
    ("0:3,1:0,2:1", ((0, ("stdout", "stderr")), (2, ("stdout",)))),
])
def test_std(value: str, expected: tuple[Any, ...]) -> None:
    assert parse_std("-r/--redirects", value) == expected


@pytest.mark.parametrize("value", ["4", "-1", "0:4", "10:1", "0:1,", "a", "", "0=1"])
def test_std_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="-t/--tee"):
        parse_std("-t/--tee", value)


def test_local_ranks_filter() -> None:
    assert parse_local_ranks("") is None
    assert parse_local_ranks("0,2") == frozenset({0, 2})
    with pytest.raises(ConfigError, match="--local-ranks-filter"):
        parse_local_ranks("0,a")


@pytest.mark.parametrize(("value", "join", "last_call", "is_host", "token_file"), [
    ("", None, None, None, None),
    ("join_timeout=900", 900.0, None, None, None),
    ("is_host=1", None, None, True, None),
    ("is_host=false, read_timeout=60", None, None, False, None),
    ("agent_token_file=/t,timeout=5,last_call_timeout=3,close_timeout=9,keep_alive_interval=5,"
     "keep_alive_max_attempt=3,use_libuv=0", None, 3.0, None, Path("/t")),
])
def test_rdzv_conf(value: str, join: float | None, last_call: float | None,
                   is_host: bool | None, token_file: Path | None) -> None:
    conf, notes = parse_rdzv_conf(value)
    assert (conf.join_timeout, conf.last_call_timeout, conf.is_host, conf.agent_token_file) \
        == (join, last_call, is_host, token_file)
    assert notes == []


def test_rdzv_conf_ignores_what_torchrun_ignores_naming_it() -> None:
    """torchrun hands --rdzv-conf to its backend, which reads the keys it knows: quotes
    that no shell stripped make keys of their own (`'join_timeout`), and a value of a key
    the backend never reads (`timeout=5'`) is no error."""
    conf, notes = parse_rdzv_conf("'join_timeout=5,last_call_timeout=1,timeout=5'")
    assert conf == RdzvConf(last_call_timeout=1.0)
    assert len(notes) == 1 and notes[0].startswith("--rdzv-conf 'join_timeout: ")
    assert "ignored" in notes[0]
    _, notes = parse_rdzv_conf("store_type=file,nope=1")
    assert [note.split(":")[0] for note in notes] == ["--rdzv-conf store_type",
                                                       "--rdzv-conf nope"]


@pytest.mark.parametrize(("value", "says"), [
    ("is_host", "KEY=VALUE"), ("join_timeout=", "KEY=VALUE"),
    ("join_timeout=x", "whole number"), ("last_call_timeout=1s", "whole number"),
    ("join_timeout=0", "positive"), ("is_host=maybe", "1/0")])
def test_rdzv_conf_refused(value: str, says: str) -> None:
    """Values of keys the backend reads are checked as torch checks them."""
    with pytest.raises(ConfigError, match=says):
        parse_rdzv_conf(value)


@pytest.mark.parametrize(("endpoint", "default", "expected"), [
    ("node1:29400", None, ("node1", 29400)), ("node1", 29400, ("node1", 29400)),
    ("10.0.0.1:5", None, ("10.0.0.1", 5)), ("[::1]:7", None, ("::1", 7)),
    ("[::1]", 29400, ("::1", 29400))])
def test_endpoint(endpoint: str, default: int | None, expected: tuple[str, int]) -> None:
    assert parse_endpoint(endpoint, default) == expected


@pytest.mark.parametrize(("endpoint", "default"), [
    ("node1", None), ("node1:x", 1), ("node1:70000", 1), ("a b:1", 1)])
def test_endpoint_refused(endpoint: str, default: int | None) -> None:
    with pytest.raises(ConfigError, match="--rdzv-endpoint"):
        parse_endpoint(endpoint, default)


def test_signals() -> None:
    assert parse_signals("SIGTERM,SIGINT,SIGHUP,SIGQUIT") == (signal.SIGHUP, signal.SIGQUIT)
    assert parse_signals("SIGUSR1, usr2") == (signal.SIGUSR1, signal.SIGUSR2)
    with pytest.raises(ConfigError, match="unknown signal"):
        parse_signals("SIGNOPE")
    with pytest.raises(ConfigError, match="SIGKILL cannot"):
        parse_signals("SIGKILL")


# --- whole command lines: accepted with their meaning, or refused in one line --------------
def test_settings_of_a_torchrun_line(tmp_path: Path) -> None:
    args = parsed("--rdzv-id", "run7", "--role", "trainer", "--log-dir", str(tmp_path), "-r",
                  "0:1", "-t", "2", "--local-ranks-filter", "0", "--virtual-local-rank",
                  "--shutdown-timeout", "12", "--max-restarts", "4", "t.py")
    s = args.settings
    assert (s.run_id, s.role, s.log_dir) == ("run7", "trainer", tmp_path)
    assert s.redirects == ((0, ("stdout",)),) and s.tee == ((-1, ("stderr",)),)
    assert s.local_ranks_filter == frozenset({0}) and s.virtual_local_rank
    assert args.shutdown_timeout == 12.0 and args.max_restarts == 4


def test_shutdown_timeout_from_torchs_variable() -> None:
    args = parsed("t.py", environ={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "7"})
    assert args.shutdown_timeout == 7.0
    assert parsed("--shutdown-timeout", "3", "t.py",
                  environ={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "7"}).shutdown_timeout == 3.0


def test_own_options_are_kept_for_the_driver() -> None:
    args = parsed("--collective-timeout", "9", "--no-hang-detection", "--backend", "gloo", "t.py")
    assert args.own["collective_timeout"] == 9.0 and args.own["hang_detection"] is False
    assert args.own["backend"] == "gloo"


@pytest.mark.parametrize(("argv", "says"), [
    (["--rdzv-backend", "etcd"], "elasticrun runs its own rendezvous"),
    (["--rdzv-backend", "etcd-v2"], "elasticrun runs its own rendezvous"),
    (["--rdzv-backend", "mine"], "expected c10d or static"),
    (["--logs-specs", "x"], "--logs-specs"),
    (["--numa-binding", "node"], "--numa-binding"),
    (["--duplicate-stdout-filters", "a,b"], "--duplicate-stdout-filters"),
    (["--duplicate-stderr-filters", "a"], "--duplicate-stderr-filters"),
    (["--nproc-per-node", "xpu"], "xpu"),
    (["--nnodes", "0"], "--nnodes"),
    (["--logs-specs", "mine"], "--logs-specs 'mine'"),
    (["--no-python", "-m"], "--no-python and -m"),
    (["--shutdown-timeout", "-1"], "--shutdown-timeout"),
    (["-r", "7"], "-r/--redirects"),
    (["--signals-to-handle", "SIGFOO"], "unknown signal"),
])
def test_refused_in_one_line(argv: list[str], says: str) -> None:
    assert says in refused(*argv, "t.py")


def test_node_rank_outside_the_static_backend_is_noted() -> None:
    args = parsed("--rdzv-backend", "c10d", "--node-rank", "1", "t.py")
    assert args.notes and "--node-rank" in args.notes[0]
