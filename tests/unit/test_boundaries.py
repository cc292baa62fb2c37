"""Architecture rules that must hold, and the linters the project adopted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def imported_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    return {name.split(".")[0] for name in out.split()}


def test_driver_never_imports_torch() -> None:
    modules = imported_after("import elasticrun.cli.entry, elasticrun.driver.driver")
    assert "torch" not in modules


def test_agent_never_imports_torch_or_ssh() -> None:
    """`elasticrun agent` runs on every node, in images that may lack both."""
    modules = imported_after("import elasticrun.cli.agent, elasticrun.agent.runner")
    assert not modules & {"torch", "paramiko"}


def test_cli_face_is_lazy() -> None:
    """`elasticrun agent` and `elasticrun status` load their own module, not the driver."""
    code = ("import sys, elasticrun.cli.agent, elasticrun.cli.status; "
            "print('\\n'.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.split()
    assert not [name for name in out if name.startswith("elasticrun.driver")]


def test_worker_library_never_imports_launcher_dependencies() -> None:
    modules = imported_after("import elasticrun.torch, elasticrun.torch.elastic")
    assert not modules & {"aiohttp", "paramiko", "click"}


@pytest.mark.parametrize("command", [
    ["ruff", "check", "elasticrun", "tests", "benchmarks", "examples"],
    ["mypy", "elasticrun"],
])
def test_linters_pass(command: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", *command], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
