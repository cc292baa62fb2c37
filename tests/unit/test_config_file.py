"""Unit tests for --config-file (elasticrun.cli.config_file), through the real `cli` and
directly."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import elasticrun.cli.horovodrun
from elasticrun.cli import cli, main
from elasticrun.cli.config_file import MAX_BYTES, load_config_file
from elasticrun.job.errors import ConfigError


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Runs `cli` up to build_config: records its keyword arguments and the log level, then
    exits 0, so no job starts."""
    seen: dict[str, Any] = {}

    def fake_build_config(**kwargs: Any) -> None:
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr(elasticrun.cli.horovodrun, "build_config", fake_build_config)
    monkeypatch.setattr(elasticrun.cli.horovodrun, "setup_logging",
                        lambda level: seen.__setitem__("log_level", level))
    return seen


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def run_cli(captured: dict[str, Any], *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, (result.output, result.exception)
    return captured


def main_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The one stderr line of `elasticrun ARGS` that fails with exit status 2."""
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("elasticrun: error: "), err
    return lines[0]


# ---- through the real `cli` command


def test_file_values_reach_the_config(tmp_path: Path, captured: dict[str, Any]) -> None:
    job = write(tmp_path, "np: 4\nmin_np: 2\nmax-np: 8\ndiscovery-interval: 0.5\n"
                          "ssh-port: 2222\nnetwork-interface: eth1\nstragglers: evict\n")
    seen = run_cli(captured, "--config-file", str(job), "python", "train.py")
    assert (seen["np"], seen["min_np"], seen["max_np"]) == (4, 2, 8)
    assert seen["stragglers"] == "evict"
    assert seen["discovery_interval"] == 0.5 and seen["ssh_port"] == 2222
    assert seen["network_interface"] == "eth1"
    assert seen["command"] == ("python", "train.py")
    assert seen["start_timeout"] == 30.0  # untouched options keep their defaults


def test_horovodrun_spellings_of_flags_are_accepted(captured: dict[str, Any]) -> None:
    """A horovodrun command line keeps working: --min-num-proc, --max-num-proc, -p, -i."""
    seen = run_cli(captured, "-np", "2", "--min-num-proc", "1", "--max-num-proc", "4",
                   "-p", "2222", "-i", "/keys/id", "python", "train.py")
    assert (seen["np"], seen["min_np"], seen["max_np"]) == (2, 1, 4)
    assert seen["ssh_port"] == 2222 and str(seen["ssh_identity_file"]) == "/keys/id"


def test_command_line_flags_override_the_file(tmp_path: Path, captured: dict[str, Any]) -> None:
    job = write(tmp_path, "num-proc: 4\nmin-np: 2\nstart-timeout: 5\n")
    seen = run_cli(captured, "-np", "3", "--config-file", str(job), "--min-np", "1", "x")
    assert (seen["np"], seen["min_np"], seen["start_timeout"]) == (3, 1, 5.0)


def test_tuple_option_and_flags(tmp_path: Path, captured: dict[str, Any]) -> None:
    job = write(tmp_path, "blacklist-cooldown-range: [10, 300]\n"
                          "prefix-output-with-timestamp: true\nssh_accept_new_host_keys: yes\n")
    seen = run_cli(captured, "--config-file", str(job), "x")
    assert seen["blacklist_cooldown_range"] == (10.0, 300.0)
    assert seen["prefix_output_with_timestamp"] is True
    assert seen["ssh_accept_new_host_keys"] is True


def test_log_level_and_verbose_keys(tmp_path: Path, captured: dict[str, Any]) -> None:
    assert run_cli(captured, "--config-file", str(write(tmp_path, "log-level: warning\n")),
                   "x")["log_level"] == "WARNING"
    assert run_cli(captured, "--config-file", str(write(tmp_path, "verbose: true\n")),
                   "x")["log_level"] == "DEBUG"


@pytest.mark.parametrize("text", ["command: [python, train.py, --lr, '0.1']\n",
                                  "command: python train.py --lr '0.1'\n"])
def test_command_from_the_file(tmp_path: Path, captured: dict[str, Any], text: str) -> None:
    seen = run_cli(captured, "--config-file", str(write(tmp_path, "np: 2\n" + text)))
    assert seen["command"] == ("python", "train.py", "--lr", "0.1")


def test_command_line_command_wins(tmp_path: Path, captured: dict[str, Any]) -> None:
    job = write(tmp_path, "command: [python, train.py]\n")
    seen = run_cli(captured, "--config-file", str(job), "python", "other.py", "--np", "3")
    assert seen["command"] == ("python", "other.py", "--np", "3")


def test_relative_paths_are_resolved_from_the_files_directory(
    tmp_path: Path, captured: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "conf").mkdir()
    write(tmp_path / "conf", "hostfile: hosts.txt\nhost-discovery-script: ./hosts.sh\n"
                          "output-filename: /var/log/job\nremote-python: bin/python\n")
    monkeypatch.chdir(tmp_path)
    seen = run_cli(captured, "--config-file", "conf/job.yaml", "x")
    assert seen["hostfile"] == tmp_path / "conf" / "hosts.txt"
    assert seen["discovery_script"] == tmp_path / "conf" / "hosts.sh"
    assert seen["output_filename"] == Path("/var/log/job")
    assert seen["remote_python"] == "bin/python"  # not a click.Path: left alone


def test_no_command_anywhere_is_a_usage_error(tmp_path: Path, captured: dict[str, Any],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    line = main_error(capsys, "--config-file", str(write(tmp_path, "np: 2\n")))
    assert "Missing argument" in line


# ---- load_config_file directly


def test_spellings_and_multiple_options(tmp_path: Path) -> None:
    @click.command()
    @click.option("--config-file", expose_value=False)
    @click.option("--env", "-x", multiple=True)
    @click.option("--pair", type=(int, str), multiple=True)
    @click.option("--dry-run/--no-dry-run")
    @click.option("--extra", type=click.Path(), multiple=True)
    def command(**_: Any) -> None:
        """A stand-in for options cli does not have (yet)."""

    got = load_config_file(write(tmp_path, "env: [A=1, B=2]\npair: [[1, a], [2, b]]\n"
                                           "dry_run: false\nextra: [a, /b, ~/c, '-']\n"), command)
    extra = (str(tmp_path / "a"), "/b", str(Path("~/c").expanduser()), "-")
    assert got == {"env": ("A=1", "B=2"), "pair": ((1, "a"), (2, "b")), "dry_run": False,
                   "extra": extra}
    assert load_config_file(write(tmp_path, "env: A=1\n"), command) == {"env": ("A=1",)}
    with pytest.raises(ConfigError, match="unknown key 'config-file'"):
        load_config_file(write(tmp_path, "config-file: other.yaml\n"), command)


def test_null_and_empty_file_keep_defaults(tmp_path: Path) -> None:
    assert load_config_file(write(tmp_path, "np:\nhostfile: ~\n"), cli) == {}
    assert load_config_file(write(tmp_path, ""), cli) == {}
    assert load_config_file(write(tmp_path, "# only a comment\n"), cli) == {}


@pytest.mark.parametrize(("text", "message"), [
    ("np: four\n", "job.yaml: np: 'four' is not a valid integer"),
    ("min_nps: 2\n", "job.yaml: unknown key 'min_nps' (did you mean 'min-np'?)"),
    ("np: 2\nnum_proc: 3\n", "job.yaml: 'np' and 'num_proc' set the same option"),
    ("min-np: 2\nmin_np: 2\n", "'min-np' and 'min_np' set the same option"),
    ("- np\n- 2\n", "job.yaml: expected a mapping of flag: value, got a list"),
    ("np: [1, 2]\n", "job.yaml: np: expected a single value, got a list"),
    ("np: true\n", "job.yaml: np: expected a value, got the boolean True"),
    ("blacklist-cooldown-range: 10\n", "expected a list of 2 values, got an integer"),
    ("blacklist-cooldown-range: [1, 2, 3]\n", "expected a list of 2 values, got a list"),
    ("blacklist-cooldown-range: [1, x]\n", "'x' is not a valid float"),
    ("ssh-port: 70000\n", "job.yaml: ssh-port: 70000 is not in the range"),
    ("log-level: loud\n", "job.yaml: log-level: 'loud' is not one of"),
    ("prefix-output-with-timestamp: maybe\n", "'maybe' is not a valid boolean"),
    ("discovery-interval: {a: 1}\n", "expected a single value, got a mapping"),
    ("discovery-interval: 1" + "0" * 400 + "\n", "discovery-interval: invalid value a huge number"),
    ("prefix-output-with-timestamp: 2\n", "prefix-output-with-timestamp: invalid value 2"),
    ("command: [python, 3]\n", "command: item 2 is an integer, not a string (quote it)"),
    ("command: ''\n", "command: is empty"),
    ("command: 'python \"x'\n", "command: No closing quotation"),
    ("command: {a: b}\n", "command: expected a list of strings or a string, got a mapping"),
    ("np: 2\n  min-np: 3\n", "job.yaml: invalid YAML at line 2"),
    ("np: [1, 2\n", "job.yaml: invalid YAML at line 2"),
    ("np: 1\n---\nnp: 2\n", "invalid YAML at line 2"),
    ("np: !!python/object:os.system x\n", "invalid YAML at line 1"),
    ("d: 2024-13-45\n", "invalid YAML: month must be in 1..12"),
    ("np: \x01\n", "invalid YAML"),
    ("1: 2\n", "job.yaml: key 1 is not a string"),
])
def test_errors_are_one_line_naming_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    job = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_config_file(job, cli)
    assert message in str(exc.value) and "\n" not in str(exc.value)
    line = main_error(capsys, "--config-file", str(job), "python", "x.py")
    assert line == f"elasticrun: error: {exc.value}"


def test_file_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.yaml"
    assert main_error(capsys, "--config-file", str(missing), "x") == (
        f"elasticrun: error: {missing}: cannot read config file: No such file or directory")
    line = main_error(capsys, "--config-file", str(tmp_path), "x")  # click.Path refuses it
    assert "'--config-file'" in line and "is a directory" in line
    with pytest.raises(ConfigError, match="cannot read config file: Is a directory"):
        load_config_file(tmp_path, cli)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"np: \xff\xfe\n")
    assert main_error(capsys, "--config-file", str(binary), "x").endswith(
        "bin.yaml: not UTF-8 text (byte 4)")
    big = write(tmp_path, "# " + "x" * MAX_BYTES + "\n", "big.yaml")
    assert main_error(capsys, "--config-file", str(big), "x").endswith("larger than 1024 KiB")


def test_alias_bomb_and_deep_nesting_do_not_hang(tmp_path: Path) -> None:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 12)]
    start = time.monotonic()
    for extra in ("command: *a11\n", "np: *a11\n", "nope: *a11\n", "blacklist-cooldown-range: "
                  "*a11\n"):
        with pytest.raises(ConfigError):
            load_config_file(write(tmp_path, "\n".join(lines) + "\n" + extra), cli)
    with pytest.raises(ConfigError, match="nested too deeply|invalid YAML"):
        load_config_file(write(tmp_path, "np: " + "[" * 100_000), cli)
    assert time.monotonic() - start < 20


# ---- property: nothing but ConfigError / click.UsageError, ever

_KEYS = ["np", "num-proc", "min_np", "hostfile", "blacklist-cooldown-range", "command",
         "prefix-output-with-timestamp", "log-level", "ssh-port", "discovery-interval"]
_SCALARS = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
            | st.dates())
_DATA = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.sampled_from(_KEYS) | st.text(max_size=10), inner, max_size=4), max_leaves=20)


def _load_text(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.yaml"
        path.write_bytes(data)
        try:
            got = load_config_file(path, cli)
        except (ConfigError, click.UsageError) as exc:
            assert "\n" not in str(exc)
        else:
            assert set(got) <= {p.name for p in cli.params}


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(_KEYS), _DATA, max_size=5) | _DATA)
def test_any_yaml_data_gives_a_config_error_or_a_result(data: Any) -> None:
    _load_text(yaml.safe_dump(data).encode())


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("np: -[]{}&*!'\"#\n\t,?|>%@`0123abc~."))) | st.text())
def test_any_text_gives_a_config_error_or_a_result(text: str) -> None:
    _load_text(text.encode("utf-8", "surrogatepass"))
