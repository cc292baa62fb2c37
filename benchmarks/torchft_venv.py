"""torchft for benchmarks/torchft_compare.py: a side venv, benchmarks/.venv-torchft, with
torchft at a pinned version next to the project's own torch (installed on first use, never
part of the project's dependencies)."""

from __future__ import annotations

import importlib.util
import os
import site
import subprocess
from collections.abc import Sequence
from pathlib import Path

from benchlib import HERE, PYTHON, REPO

TORCHFT_VERSION = "0.2.0"
VENV = HERE / ".venv-torchft"


def torchft_python() -> Path | str:
    """The side venv's interpreter with torchft installed (installing it on first use), or
    why there is none."""
    if os.environ.get("BENCH_TORCHFT") == "0":
        return "BENCH_TORCHFT=0"
    python = VENV / "bin" / "python"
    if _torchft_ready(python):
        return python
    print(f"installing torchft=={TORCHFT_VERSION} into {VENV.relative_to(REPO)} (once)",
          flush=True)
    try:
        _run([PYTHON, "-m", "venv", "--clear", str(VENV)], 120)
        purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                        "['purelib'])"], 60).strip()
        # The project's site-packages after the side venv's own: its torch is reused, and
        # nothing is installed into the project's environment.
        Path(purelib, "_elasticrun_project.pth").write_text("\n".join(site.getsitepackages())
                                                            + "\n")
        _run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
              "-c", str(REPO / "constraints.txt"), f"torchft=={TORCHFT_VERSION}"], 600)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"could not install torchft=={TORCHFT_VERSION}: {_reason(exc)}"
    if not _torchft_ready(python):
        return f"torchft=={TORCHFT_VERSION} installed but pip brought its own torch"
    return python


def _torchft_ready(python: Path) -> bool:
    """torchft at the pinned version, next to the project's own torch (checked without
    importing either: that takes seconds)."""
    torch = importlib.util.find_spec("torch")
    probe = ("import importlib.metadata as m, importlib.util as u; "
             "print(m.version('torchft'), u.find_spec('torch').origin)")
    try:
        found = _run([str(python), "-c", probe], 60).split()
    except (OSError, subprocess.SubprocessError):
        return False
    return torch is not None and found == [TORCHFT_VERSION, torch.origin]


def _run(command: Sequence[str], timeout: float) -> str:
    return subprocess.run(list(command), capture_output=True, text=True, timeout=timeout,
                          check=True).stdout


def _reason(exc: BaseException) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        lines = [line for line in (exc.stderr or "").splitlines() if line.strip()]
        return lines[-1].strip()[:200] if lines else f"exit {exc.returncode}"
    return str(exc)[:200]
