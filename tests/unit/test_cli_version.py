"""`elasticrun --version`: the real command, in a subprocess, prints `elasticrun VERSION` and
exits 0 in either CLI form; VERSION is elasticrun.__version__, the one the package's metadata
is built from."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

import elasticrun

COMMAND = Path(sys.executable).parent / "elasticrun"  # the installed console script
EXPECTED = f"elasticrun {elasticrun.__version__}\n"


def run(argv: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {name: value for name, value in os.environ.items()
               if name not in ("PET_NPROC_PER_NODE", "PET_NNODES")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**environ, **env}, stdin=subprocess.DEVNULL)


def test_the_metadata_version_is_the_package_version() -> None:
    assert version("elasticrun") == elasticrun.__version__


@pytest.mark.parametrize("args", [
    ["--version"],  # elasticrun's own form
    ["-np", "2", "--version"],  # an option only elasticrun's own form has
    ["--nproc-per-node", "2", "--version"],  # torchrun's form
    ["--version", "--standalone"],
], ids=["alone", "own-form", "torchrun-form", "before-torchrun-option"])
def test_version(args: list[str], tmp_path: Path) -> None:
    assert COMMAND.exists(), f"{COMMAND}: the elasticrun command is not installed"
    done = run([str(COMMAND), *args], tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, EXPECTED, "")


def test_version_in_a_kubeflow_pod(tmp_path: Path) -> None:
    """PET_NNODES set chooses torchrun's form; --version answers the same."""
    done = run([str(COMMAND), "--version"], tmp_path, PET_NNODES="1")
    assert (done.returncode, done.stdout, done.stderr) == (0, EXPECTED, "")


def test_version_as_a_module(tmp_path: Path) -> None:
    done = run([sys.executable, "-m", "elasticrun", "--version"], tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, EXPECTED, "")
