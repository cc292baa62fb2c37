"""README.md is the package's long description: short, rendered by the renderer the package
index uses, without links that break there, and its test command is the one CI runs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import readme_renderer.markdown

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_the_readme_is_the_long_description_and_short() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["readme"] == "README.md"
    assert len(README.splitlines()) <= 250


def test_the_readme_renders_on_a_package_index() -> None:
    assert readme_renderer.markdown.render(README, variant="GFM") is not None


def test_the_readme_has_no_link_that_breaks_off_the_repository() -> None:
    targets = re.findall(r"\]\(([^)\s]+)", README)
    relative = [t for t in targets if not t.startswith(("https://", "http://", "#"))]
    assert not relative, f"relative links break on a package index: {relative}"


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line for line in ci.splitlines() if line.startswith("python -m pytest")]
    assert commands and all(command in README for command in commands)
    install = next(line for line in ci.splitlines() if "-e \".[" in line)
    extras = re.search(r'-e "(\.\[[^]]*\])"', install)
    assert extras is not None and extras.group(1) in README
