"""Whether the job's script calls er.init(), as far as its text says, before anything starts.

The round machine runs a job's rounds in restart mode until a worker calls er.init()
(driver/rounds/restarts.py): what the workers do decides. At the start nothing is known
yet, and a failure then (a host that cannot be reached, a worker that dies in its set-up)
would restart the others too, as for a torchrun script. A script whose text calls
elasticrun.torch's init() (`er.init()` after `import elasticrun.torch as er`, or
`from elasticrun import torch as hvd` ... `hvd.init()`) is taken for one that does from its
first round. An import alone never is: a torchrun script that uses an integration
(elasticrun.integrations) or a helper of elasticrun's stays a torchrun script. A script
that calls it only indirectly (through a library of its own) says so at its er.init().
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

MAX_BYTES = 4 * 1024 * 1024  # a script larger than this is not read
# The names elasticrun.torch is imported as, at the start of a line (inside a function too):
# `import elasticrun.torch as er`, `from elasticrun import torch as hvd`,
# `from elasticrun import torch`, `import elasticrun.torch` (then `elasticrun.torch.init()`).
_ALIASES = (
    re.compile(rb"^[ \t]*import[ \t]+elasticrun\.torch[ \t]+as[ \t]+(\w+)", re.MULTILINE),
    re.compile(rb"^[ \t]*from[ \t]+elasticrun[ \t]+import[ \t]+torch(?:[ \t]+as[ \t]+(\w+))?",
               re.MULTILINE),
)
_PLAIN_IMPORT = re.compile(rb"^[ \t]*import[ \t]+elasticrun\.torch[ \t]*(?:#.*)?$",
                           re.MULTILINE)
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?")


def calls_init(command: Sequence[str], cwd: Path) -> bool:
    """Whether the script of `command` (`python [options] SCRIPT ...` or `python -m MODULE
    ...`, or SCRIPT run itself) calls elasticrun.torch's init(), as its text says. Unknown
    (not a Python script, not readable): False."""
    path = _script(command, cwd)
    if path is None:
        return False
    try:
        with open(path, "rb") as source:
            text = source.read(MAX_BYTES)
    except OSError:
        return False
    names = [match.group(1) or b"torch" for pattern in _ALIASES
             for match in pattern.finditer(text)]
    if _PLAIN_IMPORT.search(text):
        names.append(rb"elasticrun\.torch")
    return any(re.search(rb"(?<![\w.])" + (name if name.startswith(b"elasticrun")
                                           else re.escape(name)) + rb"\.init\(", text)
               for name in names)


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
