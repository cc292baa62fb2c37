"""torchrun's form, translated: one node or several, the driver's DriverConfig and each node's
agent (tables), which node hosts (real sockets: 127.0.0.1, and TEST-NET's 192.0.2.1, only
ever bound, never sent to), and the nodes' agent token."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticrun.agent.runner import REFUSED_EXIT
from elasticrun.cli import machine
from elasticrun.cli.node_claim import bind_endpoint
from elasticrun.cli.torchrun import read_options, torchrun_cli
from elasticrun.cli.torchrun_args import Devices, TorchrunArgs
from elasticrun.cli.torchrun_launch import (
    agent_token,
    child_agent_argv,
    kept_logs,
    stopping_signals,
)
from elasticrun.cli.torchrun_plan import (
    TOKEN_PREFIX,
    Nodes,
    decide_hosting,
    derived_token,
    node_agent_settings,
    node_result,
    nodes_driver_config,
    plan,
)
from elasticrun.job.config import DriverConfig, TorchrunSettings
from elasticrun.job.errors import ConfigError

PY = "/usr/bin/python3"
TOKEN = "t" * 32


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("PET_")]:
        monkeypatch.delenv(name)
    for name in ("ELASTICRUN_AGENT_TOKEN", "SLURMD_NODENAME", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)


def parsed(*argv: str) -> TorchrunArgs:
    options = torchrun_cli.make_context("elasticrun", list(argv)).params
    args, _, _ = read_options(options, Devices(2, 8), {"PYTHON_EXEC": PY})
    return args


def planned(*argv: str) -> DriverConfig | Nodes:
    return plan(parsed(*argv))


# --- one node -----------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["--standalone", "--nproc-per-node", "3"],
    ["--nproc-per-node", "3"],
    ["--nnodes", "1", "--nproc-per-node", "3"],
    ["--nnodes", "1:1", "--nproc-per-node", "3", "--rdzv-backend", "c10d"],
    ["--nproc-per-node", "3", "--master-port", "29500"],  # --nnodes 1, no endpoint
    ["--standalone", "--nproc-per-node", "3", "--rdzv-endpoint", "x:1"],  # ignored, as torchrun
    ["--nnodes", "1", "--nproc-per-node", "3", "--rdzv-backend", "c10d",
     "--rdzv-endpoint", "localhost:0"],  # torchrun's other single-node idiom
])
def test_one_node(argv: list[str]) -> None:
    config = planned(*argv, "t.py", "--a")
    assert isinstance(config, DriverConfig)
    assert (config.np, config.min_np, config.max_np) == (3, 3, 3)
    assert config.hosts == (("localhost", 3),)
    assert config.command == (PY, "t.py", "--a")
    assert config.max_restarts == 0  # torchrun's default, not the -np form's
    assert not config.uses_agents and config.port == 0


def test_one_node_carries_the_torchrun_settings() -> None:
    config = planned("--standalone", "--rdzv-id", "r1", "--role", "w", "--max-restarts", "2",
                     "--shutdown-timeout", "11", "--rdzv-conf", "join_timeout=45",
                     "--collective-timeout", "20", "--init-timeout", "99", "t.py")
    assert isinstance(config, DriverConfig)
    assert config.torchrun.run_id == "r1" and config.torchrun.role == "w"
    assert config.max_restarts == 2 and config.stop_grace_period == 11.0
    assert config.start_timeout == 45.0 and config.collective_timeout == 20.0
    assert config.init_timeout == 99.0


def test_no_rdzv_id_is_the_jobs_own() -> None:
    config = planned("--standalone", "t.py")
    assert isinstance(config, DriverConfig) and config.torchrun.run_id is None


def test_standalone_with_several_nodes_is_refused() -> None:
    with pytest.raises(ConfigError, match="--standalone runs one node"):
        planned("--standalone", "--nnodes", "2", "t.py")


def test_several_nodes_need_an_endpoint_with_c10d() -> None:
    with pytest.raises(ConfigError, match="needs --rdzv-endpoint"):
        planned("--nnodes", "2", "--rdzv-backend", "c10d", "t.py")


# --- several nodes ------------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "host", "port", "hosting", "join"), [
    (["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "n1:1234"],
     "n1", 1234, None, 600.0),
    (["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "n1"],
     "n1", 29400, None, 600.0),
    (["--nnodes", "2", "--rdzv-endpoint", "n1:9"], "n1", 9, None, 600.0),  # static backend
    (["--nnodes", "1:4", "--rdzv-backend", "c10d", "--rdzv-endpoint", "n1:9",
      "--rdzv-conf", "is_host=0,join_timeout=30"], "n1", 9, False, 30.0),
    (["--nnodes", "2", "--node-rank", "0", "--master-addr", "m", "--master-port", "7"],
     "m", 7, True, 600.0),
    (["--nnodes", "2", "--node-rank", "1", "--master-addr", "m", "--master-port", "7"],
     "m", 7, False, 600.0),
    (["--nnodes", "2", "--master-addr", "m"], "m", 29500, None, 600.0),
    (["--nnodes", "2", "--node-rank", "1", "--rdzv-conf", "is_host=1", "--master-addr", "m"],
     "m", 29500, True, 600.0),
    (["--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "n1:9"],
     "n1", 9, None, 600.0),
])
def test_several_nodes(argv: list[str], host: str, port: int, hosting: bool | None,
                       join: float) -> None:
    assert planned(*argv, "t.py") == Nodes(host, port, hosting, join)


def test_port_0_on_several_nodes_is_refused() -> None:
    with pytest.raises(ConfigError, match="cannot know which port"):
        planned("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:0", "t.py")


def test_static_backend_endpoint_needs_a_port() -> None:
    with pytest.raises(ConfigError, match="needs a port"):
        planned("--nnodes", "2", "--rdzv-endpoint", "n1", "t.py")


def nodes_args() -> TorchrunArgs:
    return parsed("--nnodes", "2:3", "--nproc-per-node", "4", "--rdzv-backend", "c10d",
                  "--rdzv-endpoint", "n1:29411", "--rdzv-id", "job9", "--max-restarts", "1",
                  "--shutdown-timeout", "8", "--driver-grace", "40", "t.py")


def test_the_driver_of_several_nodes() -> None:
    args = nodes_args()
    nodes = plan(args)
    assert isinstance(nodes, Nodes)
    config = nodes_driver_config(args, nodes, "10.1.2.3", TOKEN)
    assert (config.np, config.min_np, config.max_np) == (8, 8, 12)
    assert config.launcher == "agent" and config.discovery == "agents" and config.uses_agents
    assert config.port == 29411 and config.bind == ("10.1.2.3",)
    assert config.agent_token == TOKEN and config.start_timeout == 600.0
    assert config.max_restarts == 1 and config.stop_grace_period == 8.0
    assert config.torchrun.run_id == "job9" and config.driver_timeout == 40.0
    assert config.last_call == 30.0  # torchrun's last_call_timeout: MIN nodes, then more


@pytest.mark.parametrize(("argv", "last_call"), [
    (["--nnodes", "2"], None),  # MIN = MAX: it starts with them
    (["--nnodes", "1:2"], 30.0),
    (["--nnodes", "1:2", "--rdzv-conf", "last_call_timeout=2"], 2.0)])
def test_the_last_call(argv: list[str], last_call: float | None) -> None:
    args = parsed(*argv, "--rdzv-backend", "c10d", "--rdzv-endpoint", "n1:5", "t.py")
    nodes = plan(args)
    assert isinstance(nodes, Nodes)
    assert nodes_driver_config(args, nodes, "127.0.0.1", TOKEN).last_call == last_call


def test_each_nodes_agent() -> None:
    args = nodes_args()
    nodes = plan(args)
    assert isinstance(nodes, Nodes)
    settings = node_agent_settings(args, nodes, "n1", "node-b", TOKEN, Path("/w"))
    assert settings.driver == "http://n1:29411" and settings.host == "node-b"
    assert settings.slots == 4 and settings.token == TOKEN
    assert settings.first_contact_timeout == 600.0 and settings.exit_with_job
    assert settings.stop_grace == 8.0 and settings.driver_grace == 40.0
    assert settings.working_dir == Path("/w") and "--rdzv-id" in settings.token_hint
    v6 = node_agent_settings(args, nodes, "fd00::1", "node-b", TOKEN, Path("/w"))
    assert v6.driver == "http://[fd00::1]:29411"


def test_the_hosting_nodes_child_agent_keeps_its_token_off_the_command_line() -> None:
    args = nodes_args()
    nodes = plan(args)
    assert isinstance(nodes, Nodes)
    argv = child_agent_argv(node_agent_settings(args, nodes, "10.0.0.1", "a", TOKEN,
                                                Path("/w")), "INFO")
    assert argv[1:4] == ["-m", "elasticrun", "agent"]
    assert TOKEN not in " ".join(argv)
    assert argv[argv.index("--driver") + 1] == "http://10.0.0.1:29411"
    assert argv[argv.index("--slots") + 1] == "4"


@pytest.mark.parametrize(("job", "agent", "code"), [
    (0, 0, 0), (1, 1, 1), (0, REFUSED_EXIT, REFUSED_EXIT), (1, REFUSED_EXIT, 1),
    (0, -9, 0)])  # killed after the job's end, its workers ran
def test_a_hosting_node_whose_agent_was_refused_never_exits_0(job: int, agent: int,
                                                              code: int) -> None:
    got, why = node_result(job, agent)
    assert got == code and (why is not None) == (job == 0 and agent == REFUSED_EXIT)


# --- who hosts ----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def listening() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_own_address_is_one_a_socket_binds_to() -> None:
    assert machine.own_address(["127.0.0.1"]) == "127.0.0.1"
    assert machine.own_address(["192.0.2.1"]) is None  # TEST-NET-1: never this machine's
    assert machine.own_address(["192.0.2.1", "127.0.0.1"]) == "127.0.0.1"
    assert "127.0.0.1" in machine.resolve("localhost")
    assert machine.resolve("no-such-host.invalid") == []


def test_bind_endpoint(listening: int) -> None:
    """The launcher that binds the endpoint hosts the job; one that finds it held joins."""
    assert bind_endpoint("127.0.0.1", listening) is None
    sock = bind_endpoint("127.0.0.1", free_port())
    assert sock is not None
    with sock:
        assert bind_endpoint("127.0.0.1", sock.getsockname()[1]) is None
    with pytest.raises(OSError):
        bind_endpoint("192.0.2.1", free_port())  # TEST-NET-1: not this machine's


@pytest.mark.parametrize(("hosting", "own", "taken", "driver"), [
    (None, "127.0.0.1", False, True),  # the endpoint is this node's, its port free
    (None, "127.0.0.1", True, False),  # another elasticrun here hosts already
    (None, None, False, False),  # the endpoint is another node's
    (True, None, False, True),  # is_host=1 / node rank 0
    (False, "127.0.0.1", False, False),  # is_host=0 / node rank 1
])
def test_decide_hosting(hosting: bool | None, own: str | None, taken: bool,
                        driver: bool) -> None:
    assert decide_hosting(Nodes("h", 1, hosting, 600.0), own, taken).driver is driver


def test_a_host_told_to_host_whose_port_is_taken_is_refused() -> None:
    with pytest.raises(ConfigError, match="in use on this node"):
        decide_hosting(Nodes("h", 1, True, 600.0), "127.0.0.1", True)


@pytest.mark.parametrize(("endpoint", "held", "driver"), [
    ("127.0.0.1", False, True), ("127.0.0.1", True, False), ("192.0.2.1", False, False)])
def test_hosting_with_real_sockets(listening: int, endpoint: str, held: bool,
                                   driver: bool) -> None:
    port = listening if held else free_port()
    own = machine.own_address(machine.resolve(endpoint))
    bound = bind_endpoint(own, port) if own else None
    taken = own is not None and bound is None
    if bound is not None:
        bound.close()
    assert decide_hosting(Nodes(endpoint, port, None, 600.0), own, taken).driver is driver


# --- the agent token ----------------------------------------------------------------------
def test_the_derived_token() -> None:
    token = derived_token("job9")
    assert token == hashlib.sha256((TOKEN_PREFIX + "job9").encode()).hexdigest()
    assert len(token) == 64 and token != derived_token("job8")
    assert agent_token(nodes_args()) == (token, True)


def test_a_given_token_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ELASTICRUN_AGENT_TOKEN", "e" * 20)
    assert agent_token(nodes_args()) == ("e" * 20, False)
    (tmp_path / "tok").write_text("f" * 20 + "\n")
    args = parsed("--rdzv-conf", f"agent_token_file={tmp_path / 'tok'}", "t.py")
    assert agent_token(args) == ("f" * 20, False)


def test_a_short_or_missing_token_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    monkeypatch.setenv("ELASTICRUN_AGENT_TOKEN", "short")
    with pytest.raises(ConfigError, match="at least 16"):
        agent_token(nodes_args())
    args = parsed("--rdzv-conf", f"agent_token_file={tmp_path / 'none'}", "t.py")
    with pytest.raises(ConfigError, match="agent_token_file"):
        agent_token(args)


def test_node_name(monkeypatch: pytest.MonkeyPatch) -> None:
    assert machine.node_name("n7", {"SLURMD_NODENAME": "s1"}) == "n7"
    assert machine.node_name(None, {"SLURMD_NODENAME": "s1"}) == "s1"
    assert machine.node_name(None, {}) == socket.gethostname()


# --- output kept without --log-dir --------------------------------------------------------
def test_redirects_without_a_log_dir_get_a_temporary_one() -> None:
    assert kept_logs(TorchrunSettings()) == TorchrunSettings()
    kept = kept_logs(TorchrunSettings(tee=((-1, ("stdout",)),)))
    assert kept.log_dir is not None and kept.log_dir.is_dir()
    assert kept.log_dir.name.startswith("torchelastic_")
    kept.log_dir.rmdir()


# --- --signals-to-handle ------------------------------------------------------------------
def test_listed_signals_stop_the_job_as_sigterm_does() -> None:
    seen: list[int] = []
    previous_term = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    previous_usr1 = signal.getsignal(signal.SIGUSR1)
    try:
        with stopping_signals((signal.SIGUSR1,)):
            os.kill(os.getpid(), signal.SIGUSR1)
            for _ in range(100):
                if seen:
                    break
                time.sleep(0.01)
        assert seen == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGUSR1) == previous_usr1  # put back
    finally:
        signal.signal(signal.SIGTERM, previous_term)
