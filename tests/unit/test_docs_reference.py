"""The docs' reference is generated from the code and kept whole: the site builds with
warnings as errors, every public name of the worker API and every flag of every command is on
its generated page, and every environment variable a flag reads is on the environment page."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest

import elasticrun.torch as er
import elasticrun.torch.elastic as er_elastic
from elasticrun.cli.agent import agent_command
from elasticrun.cli.horovodrun import cli
from elasticrun.cli.status import status_command
from elasticrun.cli.torchrun import torchrun_cli

DOCS = Path(__file__).resolve().parents[2] / "docs"
# One pytest worker takes this module's tests, so that the site is built once (a build is
# ~15 s of CPU: three workers each building it cost the suite half a minute).
pytestmark = pytest.mark.xdist_group("docs-build")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as text (the same sources .ci/run builds as HTML)."""
    out = tmp_path_factory.mktemp("docs")
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-q", "-W", "--keep-going", "-b", "text",
         "-d", str(out / ".doctrees"), str(DOCS), str(out)],
        capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"the docs do not build cleanly:\n{done.stderr[-4000:]}"
    return out


def _flags(command: click.Command) -> set[str]:
    return {flag for param in command.params if isinstance(param, click.Option)
            for flag in (*param.opts, *param.secondary_opts)}


@pytest.mark.parametrize(("command", "page"), [
    (cli, "reference/cli.txt"), (status_command, "reference/cli.txt"),
    (agent_command, "reference/cli.txt"), (torchrun_cli, "reference/cli-torchrun.txt"),
], ids=["horovodrun-form", "status", "agent", "torchrun-form"])
def test_every_flag_is_in_the_cli_reference(built: Path, command: click.Command,
                                            page: str) -> None:
    text = (built / page).read_text()
    missing = sorted(flag for flag in _flags(command) if flag not in text)
    assert not missing, f"{page} lacks {missing}"


@pytest.mark.parametrize("module", [er, er_elastic], ids=lambda m: m.__name__)
def test_every_public_name_of_the_worker_api_is_documented(built: Path, module: object) -> None:
    text = (built / "reference" / "api.txt").read_text()
    prefix = module.__name__  # type: ignore[attr-defined]
    missing = sorted(name for name in module.__all__  # type: ignore[attr-defined]
                     if f"{prefix}.{name}" not in text)
    assert not missing, f"reference/api.txt lacks {missing} (a docstring missing?)"


def test_every_environment_variable_a_flag_reads_is_on_the_environment_page() -> None:
    page = (DOCS / "reference" / "environment.md").read_text()
    read = {name for command in (cli, torchrun_cli, status_command, agent_command)
            for param in command.params if isinstance(param, click.Option)
            for name in ([param.envvar] if isinstance(param.envvar, str)
                         else list(param.envvar or ()))}
    assert read, "no flag reads an environment variable: the test looks in the wrong place"
    missing = sorted(name for name in read if name not in page)
    assert not missing, f"docs/reference/environment.md lacks {missing}"
