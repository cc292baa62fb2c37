"""The package's layout holds: nothing loose at its root, no import circle, no import into
the driver from below it, and no module past 300 lines without a docstring line saying why.

Read from the code's own import statements (ast), every module of the package, so that a
new module or import is checked the day it lands."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "elasticrun"
MAX_LINES = 300
ROOT_FILES = {"__init__.py", "__main__.py", "py.typed"}
# The packages a module of these may import from elasticrun (besides its own package):
# each concern sits above the ones it uses. The driver is imported only from above it.
BELOW_DRIVER = ("job", "protocol", "system", "discovery", "launch", "agent", "worker",
                "torch", "flash", "integrations")
OVERSIZE_REASON = "over 300 lines"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, name: str) -> Iterator[str]:
    """The elasticrun modules `path` imports, at any depth of the file (a function's lazy
    import counts: it runs when the function does)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + is_package]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: {target for target in imports_of(path, name)
                   if target in known and target != name}
            for name, path in known.items()}


def test_nothing_is_loose_at_the_package_root() -> None:
    loose = {p.name for p in PACKAGE.iterdir() if p.is_file()} - ROOT_FILES
    assert not loose, f"modules at elasticrun/'s root: {sorted(loose)}; give each a package"


def test_no_import_circle() -> None:
    edges = graph()
    # a package's __init__ is imported with every module under it: an arrow from a module
    # to its own package's face is no circle of ideas
    edges = {m: {t for t in targets if not m.startswith(t + ".")} for m, targets in edges.items()}
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(edges[node]):
            if state.get(target) == 1:
                circles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_nothing_below_the_driver_imports_it() -> None:
    upward = sorted(f"{source} -> {target}" for source, targets in graph().items()
                    for target in targets
                    if source.split(".")[1:2] and source.split(".")[1] in BELOW_DRIVER
                    and target.startswith("elasticrun.driver"))
    assert not upward, f"imports into the driver from below it: {upward}"


def test_every_module_is_small_or_says_why() -> None:
    oversize = []
    for name, path in modules().items():
        lines = path.read_text().count("\n")
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if lines > MAX_LINES and OVERSIZE_REASON not in doc:
            oversize.append(f"{name} ({lines} lines)")
    assert not oversize, (f"modules over {MAX_LINES} lines whose docstring does not say why "
                          f"(a line with {OVERSIZE_REASON!r}): {oversize}")


def test_the_checks_see_what_they_check(tmp_path: Path) -> None:
    """The graph is read right: relative and lazy imports count, a package's face too."""
    edges = graph()
    assert "elasticrun.api.func_job" in edges["elasticrun.api.run"]  # lazy, in run()
    assert "elasticrun.protocol.env" in edges["elasticrun.protocol"]
    assert "elasticrun.driver.parts" in edges["elasticrun.driver.driver"]
    source = tmp_path / "mod.py"
    source.write_text("from . import sibling\nfrom ..up import thing\n")
    assert set(imports_of(source, "elasticrun.pkg.mod")) == {
        "elasticrun.pkg", "elasticrun.pkg.sibling", "elasticrun.up", "elasticrun.up.thing"}
