"""docs/troubleshooting.md keeps up with the code: every exception class a user can meet, every
kind of worker failure the driver records, and the words of every line that ends a job or
warns while it runs are on the page. Everything checked is read from the source (its syntax
tree, nothing imported that pulls in torch), so a new class, kind or message fails here until
the page has an entry for it."""

from __future__ import annotations

import ast
import builtins
import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "elasticrun"
PAGE = ROOT / "docs" / "troubleshooting.md"
# Literal parts of a message at least this long must be on the page word for word (shorter
# ones, like " on host ", say nothing about which message is documented).
MIN_CHUNK = 12


@dataclass(frozen=True)
class Module:
    name: str  # dotted
    path: Path
    tree: ast.Module

    def imports(self) -> dict[str, str]:
        """Local name -> the dotted name it stands for (top-level imports only)."""
        names: dict[str, str] = {}
        for node in self.tree.body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        names[alias.asname] = alias.name
                    else:
                        root = alias.name.split(".")[0]
                        names[root] = root
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        return names


def _modules() -> dict[str, Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        found[name] = Module(name, path, ast.parse(path.read_text(), str(path)))
    return found


MODULES = _modules()


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


class Classes:
    """Which dotted names are exception classes: elasticrun's own, read from the syntax tree
    (classes, and module-level aliases `A = B`), others imported (never torch)."""

    def __init__(self) -> None:
        self._bases: dict[str, list[str]] = {}  # elasticrun class -> its bases, dotted
        for module in MODULES.values():
            imports = module.imports()
            for node in module.tree.body:
                if isinstance(node, ast.ClassDef):
                    self._bases[f"{module.name}.{node.name}"] = [
                        self._absolute(base, module, imports) for base in node.bases]
                elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Name):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            self._bases[f"{module.name}.{target.id}"] = [
                                self._absolute(node.value, module, imports)]
        self._known: dict[str, bool] = {}

    def _absolute(self, node: ast.expr, module: Module, imports: dict[str, str]) -> str:
        text = _dotted(node) or "?"
        head, _, rest = text.partition(".")
        if head in imports:
            return imports[head] + (f".{rest}" if rest else "")
        if f"{module.name}.{head}" in self._bases or any(
                isinstance(n, (ast.ClassDef, ast.Assign)) and _defines(n, head)
                for n in module.tree.body):
            return f"{module.name}.{text}"
        return text  # a builtin, or unknown

    def names(self) -> list[str]:
        return list(self._bases)

    def is_exception(self, dotted: str) -> bool:
        if dotted not in self._known:
            self._known[dotted] = False  # (a cycle is no exception)
            self._known[dotted] = self._decide(dotted)
        return self._known[dotted]

    def _decide(self, dotted: str) -> bool:
        if dotted in self._bases:
            return any(self.is_exception(base) for base in self._bases[dotted])
        if "." not in dotted:
            value = getattr(builtins, dotted, None)
            return isinstance(value, type) and issubclass(value, BaseException)
        module_name, _, attribute = dotted.rpartition(".")
        if module_name.split(".")[0] in ("torch", "elasticrun", "transformers", "lightning"):
            # torch and the trainers (the integrations' bases) are not imported here (they
            # change the process's environment); elasticrun's are all in _bases
            return False
        try:
            value = getattr(importlib.import_module(module_name), attribute, None)
        except ImportError:
            return False
        return isinstance(value, type) and issubclass(value, BaseException)

    def derives_from(self, dotted: str, ancestor: str) -> bool:
        return dotted == ancestor or any(self.derives_from(base, ancestor)
                                         for base in self._bases.get(dotted, ()))


def _defines(node: ast.stmt, name: str) -> bool:
    if isinstance(node, ast.ClassDef):
        return node.name == name
    return isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == name for t in node.targets)


CLASSES = Classes()


def _public_names(module: str) -> list[str]:
    for node in MODULES[module].tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def user_facing_exceptions() -> set[str]:
    """Simple names of the exception classes a user meets: everything in elasticrun.job.errors
    and every ElasticrunError wherever defined (their messages are the CLI's error lines);
    every public exception class of the code that runs inside training processes
    (elasticrun.worker, elasticrun.torch: raised into the user's script); and every
    exception the worker API exports, aliases such as HorovodInternalError included."""
    names = set()
    for dotted in CLASSES.names():
        module, _, name = dotted.rpartition(".")
        if name.startswith("_") or not CLASSES.is_exception(dotted):
            continue
        in_training = module.startswith(("elasticrun.worker", "elasticrun.torch"))
        if module == "elasticrun.job.errors" or in_training \
                or CLASSES.derives_from(dotted, "elasticrun.job.errors.ElasticrunError"):
            names.add(name)
    for api in ("elasticrun.torch", "elasticrun.torch.elastic"):
        for name in _public_names(api):
            imports = MODULES[api].imports()
            dotted = imports.get(name, f"{api}.{name}")
            if CLASSES.is_exception(dotted):
                names.add(name)
    return names


def _calls(package: str, attribute: str) -> Iterator[tuple[Module, ast.Call]]:
    for module in MODULES.values():
        if module.name.startswith(package):
            for node in ast.walk(module.tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr == attribute:
                    yield module, node


def failure_kinds() -> set[str]:
    """The `kind` of every worker failure the driver records (its metric label): the
    literal given to record_failure, or every literal exit_kind() returns."""
    kinds: set[str] = set()
    for module, call in _calls("elasticrun.driver", "record_failure"):
        kind = call.args[2] if len(call.args) > 2 else next(
            (k.value for k in call.keywords if k.arg == "kind"), None)
        if isinstance(kind, ast.Constant) and isinstance(kind.value, str):
            kinds.add(kind.value)
        elif isinstance(kind, ast.Call) and _dotted(kind.func) == "exit_kind":
            kinds |= _returned_literals("exit_kind")
        else:
            pytest.fail(f"{module.path}:{call.lineno}: a failure kind this test cannot read; "
                        f"teach it the new form")
    return kinds


def _returned_literals(function: str) -> set[str]:
    for module in MODULES.values():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.FunctionDef) and node.name == function:
                return {r.value.value for r in ast.walk(node) if isinstance(r, ast.Return)
                        and isinstance(r.value, ast.Constant) and isinstance(r.value.value, str)}
    pytest.fail(f"no function {function}() in elasticrun")


def _chunks(node: ast.expr) -> list[str]:
    """The literal parts of a message (a string, or an f-string's text between its fields)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [v.value for v in node.values
                if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    return []


def driver_lines() -> list[tuple[str, str]]:
    """(where, literal part) of every message the round machine ends a job with
    (step.fail) or warns with (step.log("warning", ...))."""
    found = []
    for module, call in [*_calls("elasticrun.driver.rounds", "fail"),
                         *_calls("elasticrun.driver.rounds", "log")]:
        args = call.args
        if call.func.attr == "log":  # type: ignore[attr-defined]
            if len(args) < 2 or not (isinstance(args[0], ast.Constant)
                                     and args[0].value == "warning"):
                continue
            message = args[1]
        elif args:
            message = args[0]
        else:
            continue
        where = f"{module.path.relative_to(ROOT)}:{call.lineno}"
        messages = [message]
        if isinstance(message, ast.Call) and isinstance(message.func, ast.Name):
            messages = _returned(message.func.id)  # step.fail(_spent(...)): its returns
        found += [(where, chunk.strip()) for m in messages for chunk in _chunks(m)
                  if len(chunk.strip()) >= MIN_CHUNK]
    return found


def _returned(function: str) -> list[ast.expr]:
    """What a function of the round machine returns (the messages it builds)."""
    for module in MODULES.values():
        if module.name.startswith("elasticrun.driver.rounds"):
            for node in module.tree.body:
                if isinstance(node, ast.FunctionDef) and node.name == function:
                    return [r.value for r in ast.walk(node)
                            if isinstance(r, ast.Return) and r.value is not None]
    return []


@pytest.fixture(scope="module")
def page() -> str:
    return " ".join(PAGE.read_text().split())  # a message may wrap in the source


def test_the_derivations_find_what_they_should() -> None:
    """The checks below are only as good as what they enumerate: known members of each set
    must be found (should the code move, this says so instead of checking nothing)."""
    assert {"ConfigError", "JobFailedError", "WorkersFailedError", "HostsUpdatedInterrupt",
            "HorovodInternalError"} <= user_facing_exceptions()
    assert {"exit_code", "signal", "hang"} <= failure_kinds()
    assert any("no progress possible" in chunk for _, chunk in driver_lines())


def test_every_user_facing_exception_is_named(page: str) -> None:
    missing = sorted(n for n in user_facing_exceptions() if f"`{n}`" not in page)
    assert not missing, f"docs/troubleshooting.md does not name {missing}"


def test_every_failure_kind_has_an_entry(page: str) -> None:
    missing = sorted(k for k in failure_kinds() if f"`{k}`" not in page)
    assert not missing, f"docs/troubleshooting.md has no failure kind {missing}"


def test_every_line_that_ends_or_warns_a_job_is_on_the_page(page: str) -> None:
    missing = [f"{where}: {chunk!r}" for where, chunk in driver_lines() if chunk not in page]
    assert not missing, "docs/troubleshooting.md lacks these messages:\n" + "\n".join(missing)
