"""A pytest plugin: PyTorch's own tests of torchrun (test/distributed/launcher/test_run.py)
with `torch.distributed.run.main` swapped for the `elasticrun` command, nothing else changed.

`main(args)` runs `elasticrun ARGS` as a child process (bounded) and writes its output to
sys.stdout and sys.stderr, where the tests' `redirect_stdout` reads it. Its exit status
becomes what torchrun's main would raise: 2, a command line refused, ValueError (torchrun's
for an option value it cannot use); any other failure, ChildFailedError.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

ELASTICRUN = Path(sys.executable).with_name("elasticrun")  # the installed command
TIMEOUT_S = 240.0  # one launch: its workers start, run and end


def main(args: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if args is None else args)
    command = [str(ELASTICRUN)] if ELASTICRUN.exists() else [sys.executable, "-m", "elasticrun"]
    done = subprocess.run([*command, *argv], stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=TIMEOUT_S)
    sys.stdout.write(done.stdout.decode(errors="replace"))
    sys.stderr.write(done.stderr.decode(errors="replace"))
    sys.stdout.flush()
    sys.stderr.flush()
    if done.returncode == 2:
        raise ValueError(done.stderr.decode(errors="replace").strip().splitlines()[-1:])
    if done.returncode != 0:
        from torch.distributed.elastic.multiprocessing.errors import (
            ChildFailedError,
            ProcessFailure,
        )

        failure = ProcessFailure(local_rank=0, pid=0, exitcode=done.returncode,
                                 error_file="<N/A>")
        raise ChildFailedError(name="elasticrun", failures={0: failure})


def pytest_configure(config: pytest.Config) -> None:
    import torch.distributed.run

    torch.distributed.run.main = main  # type: ignore[assignment]
