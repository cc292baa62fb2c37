"""Launchers as plugins: finding them by name and by module path, the built-ins, what a
launcher implies (discovery, the driver's port and address), and the one-line errors."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticrun.api.job_config import build_parts
from elasticrun.job import plugins
from elasticrun.job.config import DriverConfig
from elasticrun.job.errors import ConfigError
from elasticrun.launch.agents.launcher import AgentLauncher
from elasticrun.launch.auto import AutoLauncher
from elasticrun.launch.local.agents import LocalAgents
from elasticrun.launch.local.launcher import LocalLauncher
from elasticrun.launch.plugins import ENTRY_POINT_GROUP, available, load_launcher
from elasticrun.launch.slurm import SlurmLauncher, srun_command, step_env
from elasticrun.launch.ssh.agents import SSHAgents
from elasticrun.launch.ssh.launcher import SSHLauncher
from tests.unit.test_config_cli import config as cli_config

BUILTINS = {"auto": AutoLauncher, "local": LocalLauncher, "ssh": SSHLauncher,
            "agent": AgentLauncher, "slurm": SlurmLauncher}
TOKEN = "agent-token-0123456789abcdef"
PKG = "er_test_launcherpkg"


def config(**changes: object) -> DriverConfig:
    """build_config with the CLI's defaults; two local workers unless changed."""
    return cli_config(**{"np": 2, **changes})


def one_line_error(spec: str, cfg: DriverConfig | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_launcher(spec, cfg or config())
    message = str(info.value)
    assert message and "\n" not in message
    return message


def test_builtins_are_registered_as_entry_points() -> None:
    values = {ep.name: ep.value for ep in plugins.entry_points(group=ENTRY_POINT_GROUP)}
    # "local" and "ssh" choose between plain workers and, with --state-dir, the job's own
    # agents
    modules = {**{name: name for name in BUILTINS}, "local": "local.agents",
               "ssh": "ssh.agents", "agent": "agents.launcher"}
    for name in BUILTINS:
        assert values[name] == f"elasticrun.launch.{modules[name]}:plugin", values[name]
    assert set(BUILTINS) <= set(available())


@pytest.mark.parametrize("name", ["auto", "local", "ssh"])
async def test_plain_builtins_load_by_name(name: str) -> None:
    launcher = load_launcher(name, config())
    try:
        assert isinstance(launcher, BUILTINS[name])
    finally:
        await launcher.close()  # the SSH launcher quiets paramiko's logger until then


def test_the_default_is_auto() -> None:
    assert config().launcher == "auto"
    assert isinstance(build_parts(config()).launcher, AutoLauncher)


def test_slurm_needs_an_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert "not inside a Slurm allocation" in one_line_error("slurm")
    monkeypatch.setenv("SLURM_JOB_ID", "17")
    assert isinstance(load_launcher("slurm", config()), SlurmLauncher)
    assert "expected slurm or slurm:srun" in one_line_error("slurm:mpi")


@pytest.mark.parametrize(("spec", "fragment"), [
    ("nosuch", "no launcher named 'nosuch' (installed: agent, auto, local, slurm, ssh"),
    ("local:x", "the local launcher takes no argument, got 'x'"),
    ("agent", "needs the job's agent token"),
    ("no.such.module:make", "cannot import no.such.module"),
    ("pkg.mod", "a module path needs its factory"),
])
def test_bad_launchers_are_one_line(spec: str, fragment: str) -> None:
    assert fragment in one_line_error(spec)


@pytest.fixture
def plugin_pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    package = tmp_path / PKG
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "plug.py").write_text(
        "from elasticrun.launch.local.launcher import LocalLauncher\n"
        "def make(options):\n"
        "    launcher = LocalLauncher()\n"
        "    launcher.arg = options.arg\n"
        "    return launcher\n"
        "def no_start(options):\n"
        "    return object()\n"
        "def refuses(options):\n"
        "    raise ValueError('no GPUs here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{PKG}.plug"
    sys.modules.pop(f"{PKG}.plug", None)
    sys.modules.pop(PKG, None)


def test_module_path_factory_gets_its_argument(plugin_pkg: str) -> None:
    launcher = load_launcher(f"{plugin_pkg}:make:a:b", config())
    assert isinstance(launcher, LocalLauncher)
    assert launcher.arg == "a:b"  # type: ignore[attr-defined]


def test_a_factory_that_returns_no_launcher_is_refused(plugin_pkg: str) -> None:
    assert "which has no start()" in one_line_error(f"{plugin_pkg}:no_start")


def test_a_plugin_that_fails_to_start_is_one_line(plugin_pkg: str) -> None:
    assert "the plugin failed to start: ValueError: no GPUs here" in one_line_error(
        f"{plugin_pkg}:refuses")


# --- what a launcher implies ---------------------------------------------------------------------


def test_agent_launcher_implies_agents_discovery_all_interfaces_and_needs_a_port(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELASTICRUN_AGENT_TOKEN", TOKEN)
    cfg = config(np=None, min_np=2, hosts=None, launcher="agent", port=29400)
    assert cfg.discovery == "agents" and cfg.hosts is None
    assert cfg.uses_agents and cfg.bind == ("0.0.0.0",)
    assert cfg.agent_token == TOKEN and TOKEN not in repr(cfg)
    parts = build_parts(cfg)
    assert isinstance(parts.launcher, AgentLauncher) and parts.agents is not None
    with pytest.raises(ConfigError, match="give --port PORT"):
        config(np=None, min_np=2, hosts=None, launcher="agent")


def test_agents_need_a_token_of_sixteen_characters(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    monkeypatch.delenv("ELASTICRUN_AGENT_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="--agent-token-file FILE or ELASTICRUN_AGENT_TOKEN"):
        config(np=None, min_np=2, hosts=None, launcher="agent", port=29400)
    short = tmp_path / "token"
    short.write_text("short\n")
    with pytest.raises(ConfigError, match="the agent token is 5 characters"):
        config(np=None, min_np=2, hosts=None, launcher="agent", port=29400,
               agent_token_file=short)


def test_agents_discovery_with_another_launcher_still_serves_agents(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELASTICRUN_AGENT_TOKEN", TOKEN)
    cfg = config(np=None, min_np=1, hosts=None, discovery="agents", port=29400)
    assert cfg.uses_agents and cfg.launcher == "auto"
    assert build_parts(cfg).agents is not None


def test_slurm_launcher_implies_slurm_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "17")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-3]")
    cfg = config(np=None, min_np=2, hosts=None, launcher="slurm")
    assert cfg.discovery == "slurm" and not cfg.uses_agents
    # A host source given explicitly wins over the implied one.
    assert config(np=None, min_np=2, launcher="slurm", hosts="n1:2").discovery is None


def test_srun_runs_one_task_on_its_node_and_keeps_the_environment_off_the_command_line(
        tmp_path: Path) -> None:
    from elasticrun.launch.base import WorkerSpec
    spec = WorkerSpec("n2/0/1-ab", "n2", ("python", "train.py"), tmp_path,
                      {"ELASTICRUN_SECRET": "s3cret", "RANK": "1"},
                      {"SLURM_NTASKS": "6", "SLURM_JOB_ID": "17", "PATH": "/bin"})
    argv = srun_command(spec)
    assert argv[:4] == ["srun", "--overlap", "--nodes=1", "--ntasks=1"]
    assert "--nodelist=n2" in argv and "--kill-on-bad-exit=0" in argv
    assert argv[argv.index("--") + 1:] == ["python", "train.py"]
    assert not any("s3cret" in arg for arg in argv)
    env = step_env(spec)
    assert env["ELASTICRUN_SECRET"] == "s3cret" and env["SLURM_JOB_ID"] == "17"
    assert "SLURM_NTASKS" not in env  # sbatch's task count would contradict --ntasks=1


@pytest.mark.parametrize("name", ["local", "ssh", "auto"])
async def test_with_a_state_dir_workers_run_under_the_jobs_own_agents(
        name: str, tmp_path: Path) -> None:
    """So that they outlive a killed driver (--resume takes them back); the agents' token is
    the job's own, 0600 beside the journal. Without --state-dir, workers end with it."""
    host = "node1" if name == "ssh" else "localhost"
    parts = build_parts(config(launcher=name, state_dir=tmp_path / "state"))
    try:
        assert parts.agents is not None
        if name == "auto":
            launchers = [parts.launcher._local, parts.launcher._remote]  # noqa: SLF001
        else:
            launchers = [parts.launcher]
        assert {type(one) for one in launchers} == \
            {LocalAgents, SSHAgents} if name == "auto" else \
            {LocalAgents if name == "local" else SSHAgents}
        token = tmp_path / "state" / "agent-token"
        assert (token.stat().st_mode & 0o777) == 0o600
        assert parts.agents.token == token.read_text().strip()
        assert parts.launcher.outlives_driver(host)  # type: ignore[attr-defined]
        if name == "auto":
            assert parts.launcher.outlives_driver("node1")  # type: ignore[attr-defined]
    finally:
        await parts.launcher.close()
    again = build_parts(config(launcher=name, state_dir=tmp_path / "state"))
    assert again.agents is not None and again.agents.token == parts.agents.token  # resumable
    await again.launcher.close()
    plain = build_parts(config(launcher=name))
    try:
        assert plain.agents is None
        assert not getattr(plain.launcher, "outlives_driver", lambda host: False)(host)
        if name == "auto":
            assert not plain.launcher.outlives_driver("node1")  # type: ignore[attr-defined]
            assert isinstance(plain.launcher._local, LocalLauncher)  # noqa: SLF001
            assert isinstance(plain.launcher._remote, SSHLauncher)  # noqa: SLF001
    finally:
        await plain.launcher.close()
