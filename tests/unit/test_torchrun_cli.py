"""The `elasticrun` command with torchrun's form beside its own: which form a line is in
(the rule in elasticrun/cli/forms.py, as a table), and real `main([...])` calls with the
driver not started: what each form would run, and every bad input as one line."""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticrun.cli import entry, horovodrun, main, torchrun, torchrun_launch
from elasticrun.cli.forms import HOROVODRUN, TORCHRUN, choose_form
from elasticrun.cli.torchrun_plan import Nodes
from elasticrun.job.config import DriverConfig


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in [n for n in os.environ if n.startswith("PET_")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("ELASTICRUN_AGENT_TOKEN", raising=False)
    logger = logging.getLogger("elasticrun")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


# --- which form ---------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "environ", "form"), [
    (["-np", "2", "python", "train.py"], {}, HOROVODRUN),
    (["python", "train.py"], {}, HOROVODRUN),
    (["--nproc-per-node", "2", "train.py"], {}, TORCHRUN),
    (["--nproc_per_node=2", "train.py"], {}, TORCHRUN),
    (["--standalone", "train.py"], {}, TORCHRUN),
    (["-m", "pkg.train"], {}, TORCHRUN),
    (["-r3", "train.py"], {}, TORCHRUN),
    (["--nnodes=2", "--rdzv-endpoint", "h:1", "x"], {}, TORCHRUN),
    (["train.py"], {}, TORCHRUN),  # `torchrun train.py`: one process
    (["--max-restarts", "2", "train.py"], {}, TORCHRUN),  # shared: .py decides
    (["--max-restarts", "2", "python", "train.py"], {}, HOROVODRUN),
    (["--log-level", "DEBUG", "train.py"], {}, TORCHRUN),
    (["-H", "a:2", "train.py"], {}, HOROVODRUN),
    (["--min-np", "2", "train.py"], {}, HOROVODRUN),
    (["--hostfile", "h", "train.py"], {}, HOROVODRUN),
    (["--host-discovery-script", "d", "train.py"], {}, HOROVODRUN),
    (["--discovery", "static:a:1", "train.py"], {}, HOROVODRUN),
    (["--config-file", "j.yaml"], {}, HOROVODRUN),
    (["python", "t.py"], {"PET_NNODES": "2"}, TORCHRUN),
    (["t"], {"PET_NPROC_PER_NODE": "4"}, TORCHRUN),
    (["-np", "2", "python", "t.py"], {"PET_NNODES": "2"}, HOROVODRUN),
    (["-np", "2", "--nproc-per-node", "2", "t.py"], {}, TORCHRUN),  # torchrun's wins: refused
    (["--", "train.py"], {}, TORCHRUN),
    (["--", "python", "x.py"], {}, HOROVODRUN),
    (["-np", "2", "python", "--nproc-per-node", "x.py"], {}, HOROVODRUN),  # the script's own
    (["--stand", "x"], {}, TORCHRUN),  # torchrun's prefixes, as torchrun takes them
    (["--nproc=2", "x"], {}, TORCHRUN),
    (["--redirect", "3", "python", "x"], {}, TORCHRUN),
    (["--help"], {}, HOROVODRUN),
    ([], {}, HOROVODRUN),
])
def test_choose_form(args: list[str], environ: dict[str, str], form: str) -> None:
    assert choose_form(args, environ, entry._tables()) == form


# --- real main([...]) calls, the driver not started ---------------------------------------
def run_main(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> dict[str, Any]:
    """main(args), which must exit 0; what either form would have run."""
    seen: dict[str, Any] = {}

    def torchrun_job(config: DriverConfig, argv: list[str]) -> int:
        seen.update(form=TORCHRUN, config=config, argv=argv)
        return 0

    def own_job(config: DriverConfig, argv: list[str]) -> int:
        seen.update(form=HOROVODRUN, config=config, argv=argv)
        return 0

    def nodes(args: Any, target: Nodes, *_: Any) -> int:
        seen.update(form=TORCHRUN, args=args, nodes=target)
        return 0

    monkeypatch.setattr(torchrun_launch, "run_job", torchrun_job)
    monkeypatch.setattr(torchrun_launch, "run_nodes", nodes)
    monkeypatch.setattr(horovodrun, "run_job", own_job)
    monkeypatch.setattr(torchrun, "setup_logging", lambda level: seen.update(level=level))
    monkeypatch.setattr(horovodrun, "setup_logging", lambda level: seen.update(level=level))
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 0
    return seen


def one_line_error(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("elasticrun: error: "), err
    return lines[0]


def test_replacing_the_word_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = run_main(monkeypatch, ["--standalone", "--nproc-per-node", "2", "train.py", "--x"])
    config = seen["config"]
    assert seen["form"] == TORCHRUN and config.np == 2 and config.hosts == (("localhost", 2),)
    assert config.command[1:] == ("train.py", "--x")
    assert seen["argv"] == ["--standalone", "--nproc-per-node", "2", "train.py", "--x"]


def test_a_bare_script_is_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    config = run_main(monkeypatch, ["train.py"])["config"]
    assert config.np == 1 and config.max_restarts == 0


def test_module_form(monkeypatch: pytest.MonkeyPatch) -> None:
    config = run_main(monkeypatch, ["--nproc_per_node=2", "-m", "pkg.train", "a"])["config"]
    assert config.command[1:] == ("-m", "pkg.train", "a") and config.np == 2


def test_kubeflow_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PyTorchJob's pod: the sizes and the endpoint come from PET_ variables."""
    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.setenv("PET_NPROC_PER_NODE", "4")
    monkeypatch.setenv("PET_RDZV_ENDPOINT", "job-worker-0:23456")
    monkeypatch.setenv("PET_RDZV_BACKEND", "c10d")
    seen = run_main(monkeypatch, ["train.py"])
    assert seen["nodes"] == Nodes("job-worker-0", 23456, None, 600.0)
    assert seen["args"].nproc == 4


def test_own_form_gets_max_restarts_and_init_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = run_main(monkeypatch, ["-np", "2", "--max-restarts", "5", "--init-timeout", "60",
                                  "python", "t.py"])
    assert seen["form"] == HOROVODRUN
    assert seen["config"].max_restarts == 5 and seen["config"].init_timeout == 60.0
    default = run_main(monkeypatch, ["-np", "2", "python", "t.py"])["config"]
    assert default.max_restarts == 3 and default.init_timeout == 1800.0


def test_verbose_in_torchruns_form(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_main(monkeypatch, ["-v", "--standalone", "t.py"])["level"] == "DEBUG"


@pytest.mark.parametrize(("args", "says"), [
    (["--rdzv-backend", "etcd", "--nnodes", "2", "t.py"], "--rdzv-backend etcd"),
    (["--logs-specs", "x", "t.py"], "--logs-specs"),
    (["--numa-binding", "node", "t.py"], "--numa-binding"),
    (["--numa-binding", "nope", "t.py"], "--numa-binding"),
    (["--duplicate-stdout-filters", "a", "t.py"], "--duplicate-stdout-filters"),
    (["--nproc-per-node", "xpu", "t.py"], "xpu"),
    (["--standalone", "--nnodes", "2", "t.py"], "--standalone"),
    (["--rdzv-conf", "join_timeout=x", "t.py"], "--rdzv-conf join_timeout"),
    (["--n", "2", "t.py"], "ambiguous option: --n could match"),
    (["--nnodes", "x", "t.py"], "--nnodes"),
    (["--max-restarts", "-1", "t.py"], "--max-restarts"),
    (["--nproc-per-node", "2"], "SCRIPT"),
    (["-np", "2", "--nproc-per-node", "2", "t.py"], "-np is elasticrun's own form's"),
    (["--standalone", "--hostfile", "h", "t.py"], "use one form"),
    (["--master-port", "0", "--nnodes", "2", "t.py"], "cannot know which port"),
    (["--nnodes", "2", "--rdzv-endpoint", "h:99999", "--rdzv-backend", "c10d", "t.py"],
     "--rdzv-endpoint"),
])
def test_bad_torchrun_lines_are_one_line(capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch, args: list[str],
                                         says: str) -> None:
    monkeypatch.setattr(torchrun, "setup_logging", lambda level: None)
    assert says in one_line_error(capsys, args)


def test_gpu_without_gpus(capsys: pytest.CaptureFixture[str],
                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torchrun, "gpu_count", lambda environ: 0)
    monkeypatch.setattr(torchrun, "setup_logging", lambda level: None)
    assert "no GPU" in one_line_error(capsys, ["--nproc-per-node", "gpu", "t.py"])


def test_gpu_counts_the_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torchrun, "gpu_count", lambda environ: 3)
    assert run_main(monkeypatch, ["--nproc-per-node", "gpu", "t.py"])["config"].np == 3


def help_of(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    try:  # click's --help may return instead of exiting; either way the exit status is 0
        main(args)
        code: Any = 0
    except SystemExit as exc:
        code = exc.code
    assert code in (0, None)
    return capsys.readouterr().out


def test_torchrun_help_names_the_own_options(capsys: pytest.CaptureFixture[str]) -> None:
    out = help_of(capsys, ["--nproc-per-node", "1", "--help"])
    assert "SCRIPT [ARGS]" in out and "--rdzv_endpoint" in out and "PET_NNODES" in out
    assert "--collective-timeout" in out and "docs/migrating/torchrun.md" in out


def test_own_help_tells_of_torchruns_form(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--nproc-per-node" in help_of(capsys, ["--help"])


# --- `elasticrun status URL` --------------------------------------------------------------
@pytest.mark.parametrize("args", [
    ["status", "http://127.0.0.1:1"], ["status", "--url", "http://127.0.0.1:1"]])
def test_status_takes_the_url_either_way(capsys: pytest.CaptureFixture[str],
                                         args: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([*args, "--timeout", "2"])
    assert info.value.code == 1  # nothing listens there: the one line says so
    assert capsys.readouterr().err.startswith(
        "elasticrun: error: http://127.0.0.1:1/status: cannot reach the driver")


@pytest.mark.parametrize("urls", [("http://a:1", "http://b:1"), ("http://a:1", "http://a:1")],
                         ids=["different", "same"])
def test_status_with_two_urls(capsys: pytest.CaptureFixture[str], urls: tuple[str, str]) -> None:
    line = one_line_error(capsys, ["status", urls[0], "--url", urls[1]])
    assert "the URL twice" in line and "give it once" in line


def test_status_with_no_url(capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line_error(capsys, ["status", "--timeout", "2"])
    assert "no driver URL" in line and "--url" in line


# --- hostile values -----------------------------------------------------------------------
TORCHRUN_VALUED = ["--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint",
                   "--rdzv-id", "--rdzv-conf", "--max-restarts", "--monitor-interval",
                   "--start-method", "--role", "--log-dir", "-r", "-t", "--local-ranks-filter",
                   "--node-rank", "--master-addr", "--master-port", "--local-addr",
                   "--signals-to-handle", "--shutdown-timeout", "--numa-binding"]


class Started(Exception):
    """The command line was accepted: the job would start now."""


@settings(max_examples=300, deadline=None)
@given(flag=st.sampled_from(TORCHRUN_VALUED), value=st.one_of(
    st.text(max_size=30),
    st.sampled_from(["0", "-1", "1:0", "2:4", "nan", "1e400", "", " ", "h:", ":1", "[::1]:x",
                     "0:9", "a=b", "is_host=2", "SIGKILL", "gpu", "auto", "3", "\x00"])))
def test_any_torchrun_value_is_accepted_or_refused_in_one_line(flag: str, value: str) -> None:
    raw = io.BytesIO()
    stderr = io.TextIOWrapper(raw, encoding="utf-8", errors="replace")

    def started(*_: Any) -> int:
        raise Started

    with mock.patch.object(torchrun_launch, "run_job", started), \
            mock.patch.object(torchrun_launch, "run_nodes", started), \
            mock.patch.object(torchrun_launch, "kept_logs", lambda s: s), \
            mock.patch.object(torchrun, "setup_logging"), contextlib.redirect_stderr(stderr):
        try:
            main([flag, value, "--nnodes", "2", "--rdzv-endpoint", "h:1", "t.py"]
                 if flag == "--local-addr" else [flag, value, "t.py"])
            code: int | None = 0
        except Started:
            code = None
        except SystemExit as exc:
            code = int(exc.code or 0)
    stderr.flush()
    err = raw.getvalue().decode("utf-8", "replace")
    if code is None:
        return
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("elasticrun: error: "), \
        (flag, value, code, err)
