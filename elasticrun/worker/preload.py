"""What a worker template imports besides torch: the script's own imports of installed
packages, so that a worker forked after a restart does not import them again.

A torchrun-style job restarts every worker after a failure; each would import
`transformers` or `lightning` again, seconds apiece. The template imports them once, where
that is safe:
- the script's top-level `import X` and `from X import a, b` (`a`, `b` looked up too: such
  packages load their parts lazily) whose package is installed, in a site-packages
  directory or the standard library: never the user's own modules (next to the script, an
  editable install), whose import may do anything; plus the modules named in
  ELASTICRUN_PRELOAD (comma-separated). With
  ELASTICRUN_PRELOAD=0 the template imports torch alone.
- afterwards the template must still fork safely: no CUDA driver loaded (a child forked
  after that cannot use CUDA) and no thread more than before them (a lock another thread
  holds at the fork stays held in the child for ever). Otherwise the template starts over
  without them (template.py), and the workers import them themselves, as before.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import site
import sysconfig
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from elasticrun import protocol

MAX_SOURCE_BYTES = 4 * 1024 * 1024  # a "script" larger than this is not read for imports


@dataclass(frozen=True)
class Wanted:
    """A module to import, and names to look up in it (`from module import names`)."""

    module: str
    names: tuple[str, ...] = ()


def wanted(command: Sequence[str], cwd: str, env: Mapping[str, str]) -> list[Wanted]:
    """What the template of `command` (`python SCRIPT ...` or `python -m MODULE ...`)
    imports besides torch."""
    setting = env.get(protocol.ENV_PRELOAD, "").strip()
    if setting == "0":
        return []
    named = [Wanted(name.strip()) for name in setting.split(",") if name.strip()]
    source = _source_of(command, cwd)
    if source is None:
        return named
    libraries = _library_dirs()
    return named + [w for w in top_level_imports(source) if _installed(w.module, libraries)]


def top_level_imports(text: str) -> list[Wanted]:
    """The absolute imports a module makes at its top level (also inside a top-level
    `try`), in order; a module that does not parse has none."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    found: list[Wanted] = []
    body = list(tree.body)
    for node in body:
        if isinstance(node, ast.Try):
            body.extend(node.body)
        elif isinstance(node, ast.Import):
            found += [Wanted(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(Wanted(node.module, tuple(a.name for a in node.names
                                                   if a.name != "*")))
    return found


def import_all(modules: Sequence[Wanted]) -> list[str]:
    """Imports each (what fails is left to the workers); returns those imported."""
    done = []
    for want in modules:
        try:
            module = importlib.import_module(want.module)
            for name in want.names:
                if not hasattr(module, name):  # not an attribute: perhaps a submodule
                    importlib.import_module(f"{want.module}.{name}")
        except Exception:  # noqa: BLE001 - any error of theirs is the worker's to meet
            continue
        done.append(want.module)
    return done


def thread_count() -> int:
    """Threads of this process, its native ones included (0: unknown)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def fork_safe(threads_before: int, cuda_loaded: bool) -> bool:
    """Whether the process may still fork workers after importing what was wanted."""
    return not cuda_loaded and threading.active_count() == 1 \
        and thread_count() <= threads_before


def _source_of(command: Sequence[str], cwd: str) -> str | None:
    try:
        if command[1] == "-m":
            spec = importlib.util.find_spec(command[2])
            if spec is None or not spec.origin or not spec.origin.endswith(".py"):
                return None
            path = Path(spec.origin)
        else:
            path = Path(cwd, command[1])
        if path.stat().st_size > MAX_SOURCE_BYTES:
            return None
        return path.read_text(errors="replace")
    except (OSError, ImportError, ValueError, IndexError):
        return None


def _library_dirs() -> list[Path]:
    """Where installed packages live: the standard library and the site-packages."""
    paths = sysconfig.get_paths()
    places = {paths[name] for name in ("stdlib", "platstdlib", "purelib", "platlib")
              if name in paths}
    places.update(site.getsitepackages() + [site.getusersitepackages()])
    return [Path(place).resolve() for place in places]


def _installed(module: str, libraries: Sequence[Path]) -> bool:
    """Whether `module`'s top-level package is installed (not one of the user's own)."""
    try:
        spec = importlib.util.find_spec(module.partition(".")[0])
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    places = [spec.origin] if spec.origin and spec.has_location else []
    places += list(spec.submodule_search_locations or [])
    if not places:
        return True  # built into the interpreter
    return all(any(Path(place).resolve().is_relative_to(lib) for lib in libraries)
               for place in places)
