"""Launcher plugins in whole jobs: a third-party launcher installed with pip and found by its
entry point; the built-in `local`; a launcher that does not exist."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.harness import PYTHON, REPO, run_job

SHOW = [PYTHON, "-c", "import os; print(os.environ.get('VIA'), os.environ['RANK'])"]


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/plugins/prefixlauncher installed with pip into a directory of its own."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [PYTHON, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target),
         str(REPO / "tests" / "plugins" / "prefixlauncher")],
        check=True, capture_output=True, timeout=120)
    return target


def test_an_installed_launcher_plugin_starts_the_workers(plugin_path: Path) -> None:
    result = run_job(["-np", "2", "--launcher", "prefix:env VIA=plugin", *SHOW],
                     {"PYTHONPATH": f"{plugin_path}:{REPO}"}, timeout=90)
    assert result.returncode == 0, result.stderr
    assert sorted(line for line in result.stdout.splitlines() if "plugin" in line) == [
        "[0]<stdout>:plugin 0", "[1]<stdout>:plugin 1"]


def test_the_local_launcher_runs_every_host_here() -> None:
    result = run_job(["-H", "localhost:1,127.0.0.1:1", "--launcher", "local", *SHOW],
                     timeout=90)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["[0]<stdout>:None 0", "[1]<stdout>:None 1"]


def test_an_unknown_launcher_is_one_line_and_starts_nothing() -> None:
    result = run_job(["-np", "1", "--launcher", "nosuch", "true"], timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "elasticrun: error: --launcher: no launcher named 'nosuch' (installed: agent, auto, "
        "local, slurm, ssh)"]
