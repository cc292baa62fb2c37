"""Unit tests for job_config.build_config, DriverConfig validation and the CLI's errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import elasticrun
from elasticrun.api.job_config import build_config
from elasticrun.job.config import DriverConfig
from elasticrun.job.errors import ConfigError

CMD = ("python", "train.py")


def config(**overrides: Any) -> DriverConfig:
    """build_config with the CLI's defaults, overridden by keyword."""
    options: dict[str, Any] = {
        "command": CMD,
        "np": None,
        "min_np": None,
        "max_np": None,
        "hosts": None,
        "hostfile": None,
        "discovery_script": None,
        "discovery_interval": 1.0,
        "discovery_timeout": 10.0,
        "slots_per_host": None,
        "start_timeout": 30.0,
        "elastic_timeout": 600.0,
        "reset_limit": None,
        "blacklist_cooldown_range": None,
        "collective_timeout": 60.0,
        "network_interface": None,
        "output_filename": None,
        "prefix_output_with_timestamp": False,
    }
    options.update(overrides)
    return build_config(**options)


def config_error(**overrides: Any) -> str:
    with pytest.raises(ConfigError) as info:
        config(**overrides)
    message = str(info.value)
    assert message and "\n" not in message
    return message


# --------------------------------------------------------------------------- -np defaults


def test_np_given_no_hosts_runs_on_localhost() -> None:
    cfg = config(np=3)
    assert cfg.np == 3
    assert cfg.min_np == 3
    assert cfg.max_np == 3
    assert cfg.hosts == (("localhost", 3),)
    assert cfg.command == CMD
    assert cfg.elastic is False
    assert cfg.dynamic_hosts is False


def test_np_defaults_to_min_np() -> None:
    cfg = config(min_np=2)
    assert cfg.np == 2
    assert cfg.min_np == 2
    assert cfg.max_np is None
    assert cfg.hosts == (("localhost", 2),)
    assert cfg.elastic is True


def test_np_defaults_to_min_np_even_with_hosts() -> None:
    cfg = config(min_np=1, hosts="a:2,b:2")
    assert cfg.np == 1
    assert cfg.hosts == (("a", 2), ("b", 2))


def test_np_defaults_to_total_slots_of_hosts() -> None:
    cfg = config(hosts="a:2,b:3,[fe80::1]:1")
    assert cfg.np == 6
    assert cfg.min_np == 6
    assert cfg.max_np == 6
    assert cfg.hosts == (("a", 2), ("b", 3), ("fe80::1", 1))
    assert cfg.elastic is False


def test_hosts_without_count_use_slots_per_host() -> None:
    cfg = config(hosts="a,b:1", slots_per_host=4)
    assert cfg.hosts == (("a", 4), ("b", 1))
    assert cfg.np == 5
    assert cfg.slots_per_host == 4


def test_hosts_without_count_default_to_one_slot() -> None:
    cfg = config(hosts="a,b")
    assert cfg.hosts == (("a", 1), ("b", 1))
    assert cfg.np == 2


def test_np_required_without_hosts_or_min_np() -> None:
    message = config_error()
    assert "-np" in message


def test_np_required_with_hostfile_only(tmp_path: Path) -> None:
    assert "-np" in config_error(hostfile=tmp_path / "hosts")


def test_np_required_with_discovery_script_only(tmp_path: Path) -> None:
    assert "-np" in config_error(discovery_script=tmp_path / "discover.sh")


# --------------------------------------------------------------------------- max_np defaults


def test_max_np_defaults_to_np_when_not_elastic() -> None:
    assert config(np=4, hosts="a:4").max_np == 4


def test_max_np_none_with_min_np() -> None:
    cfg = config(np=4, min_np=2, hosts="a:4")
    assert cfg.max_np is None
    assert cfg.min_np == 2
    assert cfg.elastic is True


def test_max_np_none_with_discovery_script(tmp_path: Path) -> None:
    cfg = config(np=2, discovery_script=tmp_path / "d.sh")
    assert cfg.max_np is None
    assert cfg.min_np == 2
    assert cfg.hosts is None
    assert cfg.elastic is True
    assert cfg.dynamic_hosts is True


def test_max_np_explicit_kept() -> None:
    cfg = config(np=2, max_np=8)
    assert cfg.max_np == 8
    assert cfg.elastic is True


def test_hostfile_is_no_static_host_list(tmp_path: Path) -> None:
    cfg = config(np=2, hostfile=tmp_path / "hosts")
    assert cfg.hosts is None
    assert cfg.hostfile == tmp_path / "hosts"
    assert cfg.max_np == 2


def test_other_options_passed_through(tmp_path: Path) -> None:
    cfg = config(
        np=1,
        reset_limit=3,
        blacklist_cooldown_range=(1.0, 9.0),
        network_interface="eth0",
        output_filename=tmp_path,
        prefix_output_with_timestamp=True,
        collective_timeout=5.0,
        start_timeout=7.0,
        elastic_timeout=8.0,
        discovery_interval=0.5,
        discovery_timeout=2.0,
        command=["a", "b"],
    )
    assert cfg.reset_limit == 3
    assert cfg.blacklist_cooldown == (1.0, 9.0)
    assert cfg.network_interface == "eth0"
    assert cfg.output_filename == tmp_path
    assert cfg.prefix_timestamp is True
    assert (cfg.collective_timeout, cfg.start_timeout, cfg.elastic_timeout) == (5.0, 7.0, 8.0)
    assert (cfg.discovery_interval, cfg.discovery_timeout) == (0.5, 2.0)
    assert cfg.command == ("a", "b")


# --------------------------------------------------------------------------- invalid combinations


def test_min_np_above_np() -> None:
    assert "--min-np" in config_error(np=2, min_np=3)


def test_max_np_below_np() -> None:
    assert "--max-np" in config_error(np=4, max_np=2)


def test_max_np_below_defaulted_np() -> None:
    assert "--max-np" in config_error(hosts="a:4", max_np=2)


def test_two_host_sources(tmp_path: Path) -> None:
    message = config_error(np=1, hosts="a:1", hostfile=tmp_path / "h")
    assert "only one of" in message
    assert "only one of" in config_error(np=1, hosts="a:1", discovery_script=tmp_path / "d")
    assert "only one of" in config_error(
        np=1, hostfile=tmp_path / "h", discovery_script=tmp_path / "d"
    )


@pytest.mark.parametrize(
    ("name", "flag"),
    [
        ("discovery_interval", "--discovery-interval"),
        ("discovery_timeout", "--discovery-timeout"),
        ("start_timeout", "--start-timeout"),
        ("elastic_timeout", "--elastic-timeout"),
        ("collective_timeout", "--collective-timeout"),
    ],
)
@pytest.mark.parametrize("value", [0.0, -1.0])
def test_non_positive_timeouts(name: str, flag: str, value: float) -> None:
    message = config_error(np=1, **{name: value})
    assert message.startswith(flag)
    assert "positive" in message


@pytest.mark.parametrize(
    ("hosts", "fragment"),
    [
        ("a:zz", "'a:zz'"),
        ("a:1,b:-2", "'b:-2'"),
        ("$$$", "'$$$'"),
        ("", "no hosts given"),
        (",", "no hosts given"),
        ("[::1", "'[::1'"),
        ("a b c", "'a b c'"),
    ],
)
def test_bad_hosts_flag(hosts: str, fragment: str) -> None:
    message = config_error(hosts=hosts)
    assert message.startswith("-H/--hosts: ")
    assert fragment in message


def test_hosts_with_zero_total_slots() -> None:
    assert "gives no slots" in config_error(hosts="a:0")


@pytest.mark.parametrize("cooldown", [(5.0, 1.0), (-1.0, 3.0), (0.0, 3.0)])
def test_bad_cooldown_range(cooldown: tuple[float, float]) -> None:
    assert "--blacklist-cooldown-range" in config_error(np=1, blacklist_cooldown_range=cooldown)


def test_cooldown_range_equal_ends_ok() -> None:
    assert config(np=1, blacklist_cooldown_range=(3.0, 3.0)).blacklist_cooldown == (3.0, 3.0)


def test_negative_reset_limit() -> None:
    assert "--reset-limit" in config_error(np=1, reset_limit=-1)


def test_empty_command() -> None:
    assert "no command" in config_error(np=1, command=())


# --------------------------------------------------------------------------- DriverConfig direct


def test_driver_config_validation_direct() -> None:
    base: dict[str, Any] = {"command": CMD, "np": 2, "min_np": 1, "max_np": None}
    assert DriverConfig(**base).elastic is True
    assert DriverConfig(**{**base, "min_np": 2, "max_np": 2}).elastic is False
    for bad in ({"np": 0, "min_np": 0}, {"min_np": 0}, {"min_np": 3}, {"max_np": 1}):
        with pytest.raises(ConfigError) as info:
            DriverConfig(**{**base, **bad})
        assert "\n" not in str(info.value)


def test_driver_config_is_frozen() -> None:
    cfg = config(np=1)
    with pytest.raises(AttributeError):
        cfg.np = 2  # type: ignore[misc]


# --------------------------------------------------------------------------- real CLI


def run_cli(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    # Run the same elasticrun package that this test process imported.
    package_root = str(Path(elasticrun.__file__).resolve().parent.parent)
    pythonpath = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": pythonpath}
    return subprocess.run(
        [sys.executable, "-m", "elasticrun", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["-np", "x", "true"], "-np"),
        (["-np", "0", "true"], "-np"),
        ([], "COMMAND"),
        (["-np", "1"], "COMMAND"),
        (["-H", "a:zz", "true"], "'a:zz'"),
        (["-np", "1", "--host-discovery-script", "/nonexistent", "true"], "/nonexistent"),
        (["-np", "2", "--min-np", "3", "true"], "--min-np"),
        (["-np", "1", "-H", "a:1", "--hostfile", "hosts", "true"], "only one of"),
        (["--discovery-interval", "0", "-np", "1", "true"], "--discovery-interval"),
        (["--no-such-flag", "true"], "--no-such-flag"),
        (["true"], "-np"),
    ],
)
def test_cli_bad_input_is_one_line_error(args: list[str], fragment: str, tmp_path: Path) -> None:
    proc = run_cli(*args, tmp_path=tmp_path)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("elasticrun: error:")
    assert fragment in lines[0]
    assert proc.stdout == ""


def test_cli_help_succeeds(tmp_path: Path) -> None:
    proc = run_cli("--help", tmp_path=tmp_path)
    assert proc.returncode == 0
    assert "--host-discovery-script" in proc.stdout
    assert proc.stderr == ""
