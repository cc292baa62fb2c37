"""torchrun's command line, `elasticrun` in place of `torchrun`: an unmodified torchrun-style
script as a script and as a module, on one node; its output as torchrun writes it; the
lines of PyTorch's own launcher tests that elasticrun refused (issue 72): an abbreviated
flag, `--logs-specs default`, a quoted `--rdzv-conf`. No process left behind (run_job
checks)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from harness import SCRIPTS, free_port, run_job

pytestmark = pytest.mark.timeout(180)

SCRIPT = str(SCRIPTS / "torchrun_style.py")
RAW = re.compile(r"^torchrun-style rank=(\d+) world=2 sum=1$", re.MULTILINE)
TEED = re.compile(r"^\[default(\d)\]:torchrun-style rank=(\d+) world=2 sum=1$", re.MULTILINE)


def test_standalone_script_writes_as_torchrun_does() -> None:
    """Not teed: each line as the worker wrote it, no prefix, as torchrun's console."""
    result = run_job(["--standalone", "--nproc-per-node", "2", SCRIPT])
    assert result.returncode == 0, result.stderr
    assert sorted(RAW.findall(result.stdout)) == ["0", "1"], result.stdout + result.stderr


def test_module_with_tee_into_a_log_dir(tmp_path: Path) -> None:
    """Teed: `[<role><local rank>]:`, torchrun's prefix of a teed line."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "torchrun_module.py").write_text((SCRIPTS / "torchrun_style.py").read_text())
    logs = tmp_path / "logs"
    result = run_job(["--nproc_per_node=2", "--rdzv-id", "e2e", "--log-dir", str(logs),
                      "--tee", "1", "-m", "torchrun_module"], cwd=work)
    assert result.returncode == 0, result.stderr
    assert sorted(TEED.findall(result.stdout)) == [("0", "0"), ("1", "1")], result.stdout
    [run] = logs.iterdir()  # torchrun's layout: <run id>_<random>/attempt_<K>/<local rank>/
    assert run.name.startswith("e2e_")
    for rank in ("0", "1"):
        kept = (run / "attempt_0" / rank / "stdout.log").read_text()
        assert f"torchrun-style rank={rank} world=2 sum=1" in kept
        assert not (run / "attempt_0" / rank / "stderr.log").exists()  # --tee 1: stdout


def test_an_abbreviated_redirect_with_a_prefix_template(tmp_path: Path) -> None:
    """PyTorch's test_capture_logs_using_default_logs_specs: `--redirect=3` (argparse takes
    any unambiguous prefix of `--redirects`) and TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE."""
    result = run_job(["--nnodes=1", "--nproc-per-node=2", "--redirect=3", "--tee=3",
                      "--log-dir", str(tmp_path), SCRIPT],
                     extra_env={"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]: "})
    assert result.returncode == 0, result.stderr
    lines = re.findall(r"^\[rank(\d)\]: torchrun-style rank=(\d) world=2", result.stdout,
                       re.MULTILINE)
    assert sorted(lines) == [("0", "0"), ("1", "1")], result.stdout


def test_what_torchrun_takes_as_a_no_op_is_never_refused() -> None:
    """`--logs_specs=default` (torch's own log spec) and a `--rdzv-conf` whose quotes no
    shell stripped, as in PyTorch's test_launch_elastic: `'join_timeout` is a key of its
    own, ignored with a warning naming it; `last_call_timeout=1` works (one node of 1:2
    starts after it); `timeout=5'` is a key the c10d backend never reads."""
    result = run_job(["--nnodes=1:2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                      f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--logs_specs=default",
                      "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'", SCRIPT])
    assert result.returncode == 0, result.stderr
    assert sorted(RAW.findall(result.stdout)) == ["0", "1"], result.stdout + result.stderr
    warned = [line for line in result.stderr.splitlines() if "'join_timeout" in line]
    assert len(warned) == 1 and "ignored" in warned[0], result.stderr
    assert "error" not in result.stderr
