"""The CLI's operating options: --discovery, the webhook token, event webhooks and their key,
--port, and the `elasticrun status` subcommand."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elasticrun.cli import ENV_EVENT_SECRET, ENV_WEBHOOK_TOKEN, main
from elasticrun.job.config import DriverConfig
from elasticrun.job.errors import ConfigError
from tests.unit.test_config_cli import config as base_config

CMD = ("python", "train.py")
TOKEN = "0123456789abcdef-token"
KEY = "event-signing-key"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(ENV_WEBHOOK_TOKEN, raising=False)
    monkeypatch.delenv(ENV_EVENT_SECRET, raising=False)
    # main() sets up the "elasticrun" logger for the job; put it back for other tests.
    logger = logging.getLogger("elasticrun")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


def config(**overrides: Any) -> DriverConfig:
    return base_config(**{"np": 2, **overrides})


def config_error(**overrides: Any) -> str:
    with pytest.raises(ConfigError) as info:
        config(**overrides)
    message = str(info.value)
    assert message and "\n" not in message
    return message


def cli_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Runs main(args), which must fail with exit code 2 and one line on stderr."""
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("elasticrun: error: ")
    return lines[0]


def token_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "token"
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- --discovery


def test_discovery_with_hosts_flag(capsys: pytest.CaptureFixture[str]) -> None:
    line = cli_error(["-H", "a:1", "--discovery", "static:b:2", "true"], capsys)
    assert line == ("elasticrun: error: give only one of -H/--hosts, --hostfile, "
                    "--host-discovery-script, --discovery")


def test_discovery_is_elastic_without_static_hosts() -> None:
    cfg = config(discovery="static:b:2")
    assert cfg.discovery == "static:b:2"
    assert cfg.hosts is None
    assert cfg.max_np is None
    assert cfg.dynamic_hosts is True


def test_discovery_webhook_needs_a_token(capsys: pytest.CaptureFixture[str]) -> None:
    line = cli_error(["-np", "1", "--discovery", "webhook:a:1", "true"], capsys)
    assert line == ("elasticrun: error: --discovery webhook needs a token for the host-change "
                    "webhook: --webhook-token-file FILE or ELASTICRUN_WEBHOOK_TOKEN")


def test_bad_discovery_spec(capsys: pytest.CaptureFixture[str]) -> None:
    line = cli_error(["-np", "1", "--discovery", "pkg.mod", "true"], capsys)
    assert line == ("elasticrun: error: --discovery 'pkg.mod': a module path needs its "
                    "factory, e.g. 'pkg.mod:make'")


# --------------------------------------------------------------------------- webhook token


def test_webhook_token_from_file(tmp_path: Path) -> None:
    cfg = config(discovery="webhook", webhook_token_file=token_file(tmp_path, f"  {TOKEN}\n"))
    assert cfg.webhook_token == TOKEN


def test_webhook_token_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_WEBHOOK_TOKEN, TOKEN)
    assert config(discovery="webhook").webhook_token == TOKEN


def test_webhook_token_file_wins_over_env(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_WEBHOOK_TOKEN, "from-the-environment-0123")
    assert config(webhook_token_file=token_file(tmp_path, TOKEN)).webhook_token == TOKEN


def test_no_token_no_webhook() -> None:
    assert config().webhook_token is None


def test_webhook_token_file_empty(tmp_path: Path) -> None:
    path = token_file(tmp_path, " \n")
    assert config_error(webhook_token_file=path) == (
        f"--webhook-token-file {path}: the file is empty")


def test_webhook_token_file_missing(tmp_path: Path) -> None:
    path = tmp_path / "nope"
    assert config_error(webhook_token_file=path) == (
        f"--webhook-token-file {path}: cannot read: No such file or directory")


def test_webhook_token_too_short(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = ("the webhook token is 15 characters; use at least 16 "
                "(e.g. openssl rand -hex 32)")
    assert config_error(webhook_token_file=token_file(tmp_path, "x" * 15)) == expected
    monkeypatch.setenv(ENV_WEBHOOK_TOKEN, "x" * 15)
    assert config_error() == expected
    monkeypatch.setenv(ENV_WEBHOOK_TOKEN, "x" * 16)
    assert config().webhook_token == "x" * 16


def test_webhook_token_errors_through_main(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = token_file(tmp_path, "short")
    line = cli_error(["-np", "1", "--discovery", "webhook", "--webhook-token-file", str(path),
                      "true"], capsys)
    assert line == ("elasticrun: error: the webhook token is 5 characters; use at least 16 "
                    "(e.g. openssl rand -hex 32)")


# --------------------------------------------------------------------------- event webhooks


def test_event_webhook_bad_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_EVENT_SECRET, KEY)
    for url in ["ftp://x", "http://", "hook.example.com/x"]:
        assert config_error(event_webhooks=("http://ok/x", url)) == (
            f"--event-webhook {url!r}: expected an http:// or https:// URL")


def test_event_webhook_bad_url_through_main(capsys: pytest.CaptureFixture[str]) -> None:
    line = cli_error(["-np", "1", "--event-webhook", "ftp://x", "true"], capsys)
    assert line == "elasticrun: error: --event-webhook 'ftp://x': expected an http:// or " \
                   "https:// URL"


def test_event_webhook_needs_a_key(capsys: pytest.CaptureFixture[str]) -> None:
    line = cli_error(["-np", "1", "--event-webhook", "http://h/hook", "true"], capsys)
    assert line == ("elasticrun: error: --event-webhook needs a key to sign events with: "
                    "--event-secret-file FILE or ELASTICRUN_EVENT_SECRET")


def test_event_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_EVENT_SECRET, f" {KEY} ")
    cfg = config(event_webhooks=("http://h/hook", "https://h2:8443/x"))
    assert cfg.event_key == KEY.encode()
    assert cfg.event_webhooks == ("http://h/hook", "https://h2:8443/x")


def test_event_key_from_file(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text(KEY + "\n")
    cfg = config(event_webhooks=("http://h/hook",), event_secret_file=path)
    assert cfg.event_key == KEY.encode()


def test_event_key_file_empty(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text("")
    assert config_error(event_webhooks=("http://h/hook",), event_secret_file=path) == (
        f"--event-secret-file {path}: the file is empty")


def test_secrets_not_in_repr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_EVENT_SECRET, KEY)
    cfg = config(discovery="webhook", webhook_token_file=token_file(tmp_path, TOKEN),
                 event_webhooks=("http://h/hook",))
    assert cfg.webhook_token == TOKEN and cfg.event_key == KEY.encode()
    text = repr(cfg)
    assert "discovery='webhook'" in text
    assert TOKEN not in text
    assert KEY not in text
    assert "webhook_token" not in text and "event_key" not in text


# --------------------------------------------------------------------------- --port, status


def test_port_out_of_range(capsys: pytest.CaptureFixture[str]) -> None:
    line = cli_error(["-np", "1", "--port", "70000", "true"], capsys)
    assert "--port" in line and "70000" in line


def test_port_passed_through() -> None:
    assert config(port=8123).port == 8123


def test_status_subcommand_help(capsys: pytest.CaptureFixture[str]) -> None:
    try:  # click's --help may return instead of exiting; either way the exit status is 0
        main(["status", "--help"])
        code: Any = 0
    except SystemExit as exc:
        code = exc.code
    assert code in (0, None)
    out, err = capsys.readouterr()
    assert out.startswith("Usage: elasticrun status [OPTIONS]")
    assert "--url URL" in out and "--json" in out
    assert err == ""


def test_status_subcommand_without_url(capsys: pytest.CaptureFixture[str]) -> None:
    line = cli_error(["status"], capsys)
    assert "--url" in line


def test_status_subcommand_unreachable_driver(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["status", "--url", "http://127.0.0.1:1", "--timeout", "2"])
    assert info.value.code == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("elasticrun: error: http://127.0.0.1:1/status: cannot reach the "
                          "driver: ")
    assert len(err.splitlines()) == 1
