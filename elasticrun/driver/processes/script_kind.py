"""Whether the job's script is written for elasticrun (it calls er.init()), read from the
script itself before anything starts.

The round machine runs a job's rounds in restart mode until a worker calls er.init()
(driver/rounds/restarts.py). At the start that is not known yet, and a failure then (a host
that cannot be reached, a worker that dies in its set-up) would restart the others too,
as for a torchrun script. A script that imports elasticrun says what it is before any of
its workers has run a line: its rounds recover in-process from the first. A script that
imports it only indirectly (through a library of its own) says so at its er.init().
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

MAX_BYTES = 4 * 1024 * 1024  # a script larger than this is not read
# `import elasticrun.torch as er`, `from elasticrun import torch`, `import elasticrun`, at
# the start of a line (inside a function too)
IMPORTS_ELASTICRUN = re.compile(rb"^[ \t]*(?:import|from)[ \t]+elasticrun\b", re.MULTILINE)
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?")


def imports_elasticrun(command: Sequence[str], cwd: Path) -> bool:
    """Whether the script of `command` (`python [options] SCRIPT ...` or `python -m MODULE
    ...`, or SCRIPT run itself) imports elasticrun. Unknown (not a Python script, not
    readable): False."""
    path = _script(command, cwd)
    if path is None:
        return False
    try:
        with open(path, "rb") as source:
            return IMPORTS_ELASTICRUN.search(source.read(MAX_BYTES)) is not None
    except OSError:
        return False


def _script(command: Sequence[str], cwd: Path) -> Path | None:
    if not command:
        return None
    if not _PYTHON.fullmatch(Path(command[0]).name):
        return cwd / command[0] if command[0].endswith(".py") else None
    args = list(command[1:])
    while args and args[0].startswith("-") and args[0] != "-m":
        args.pop(0)  # interpreter options (-u, -O, ...)
    if not args:
        return None
    if args[0] == "-m":
        if len(args) < 2:
            return None
        base = cwd.joinpath(*args[1].split("."))
        return next((p for p in (base.with_suffix(".py"), base / "__main__.py")
                     if p.is_file()), None)
    return cwd / args[0]
