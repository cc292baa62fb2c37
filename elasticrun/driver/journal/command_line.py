"""The job's command line, kept beside its journal: `elasticrun --resume --state-dir DIR`
alone resumes the job with the arguments it started with, from the directory it started in.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from elasticrun.job.errors import ConfigError
from elasticrun.job.state_dir import write_private

FILE = "command.json"


def record(directory: Path, argv: Sequence[str], cwd: Path) -> None:
    """Keeps `argv` (the job's elasticrun arguments, --resume left out) and `cwd` in
    `directory` (0600: it may name paths, never a secret: those live in files and the
    environment)."""
    kept = [arg for arg in argv if arg != "--resume"]
    write_private(directory, FILE, json.dumps({"argv": kept, "cwd": str(cwd)}))


def short_resume(argv: Sequence[str]) -> Path | None:
    """The state directory of `elasticrun --resume --state-dir DIR` given alone (nothing
    else), else None."""
    args = list(argv)
    if "--resume" not in args:
        return None
    args.remove("--resume")
    if len(args) == 2 and args[0] == "--state-dir":
        return Path(args[1])
    if len(args) == 1 and args[0].startswith("--state-dir="):
        return Path(args[0].split("=", 1)[1])
    return None


def recall(directory: Path) -> tuple[list[str], Path]:
    """The arguments (with --resume) and the directory the job kept started with; a missing
    or unreadable record is one line (ConfigError)."""
    path = directory / FILE
    try:
        kept = json.loads(path.read_text())
        argv = [str(arg) for arg in kept["argv"]]
        cwd = Path(str(kept["cwd"]))
    except FileNotFoundError:
        raise ConfigError(f"--resume --state-dir {directory}: no job's command line there "
                          f"({FILE} is missing); give the job's whole command line with "
                          f"--resume") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"--resume --state-dir {directory}: {FILE} is unreadable "
                          f"({type(exc).__name__}); give the job's whole command line with "
                          f"--resume") from None
    return ["--resume", *argv], cwd
