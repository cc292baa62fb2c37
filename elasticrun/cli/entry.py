"""The `elasticrun` command's entry point: a subcommand (`status`, `agent`), or a job in one
of two forms (forms.py says which); every error the user can cause ends as one line on
stderr, `elasticrun: error: ...`, with exit code 2 (bad input) or 1, never a traceback."""

from __future__ import annotations

import functools
import os
import sys

import click

from elasticrun.cli.forms import TORCHRUN, FormTables, choose_form, mixed
from elasticrun.cli.horovodrun import cli
from elasticrun.cli.torchrun import torchrun_cli
from elasticrun.driver.journal import command_line
from elasticrun.job.errors import ConfigError, DiscoveryError, ElasticrunError


@functools.cache
def _tables() -> FormTables:
    return FormTables.of(cli, torchrun_cli)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args[:1] == ["status"]:  # `elasticrun -- status` runs a program named status
            # (imported here, as the agent's: a job's own start needs neither)
            from elasticrun.cli.status import status_command

            status_command.main(args=args[1:], prog_name="elasticrun status",
                                standalone_mode=False)
            return
        if args[:1] == ["agent"]:  # likewise `elasticrun -- agent`
            from elasticrun.cli.agent import agent_command

            agent_command.main(args=args[1:], prog_name="elasticrun agent",
                               standalone_mode=False)
            return
        if (kept := command_line.short_resume(args)) is not None:
            args, cwd = command_line.recall(kept)  # the job as it started, from where
            os.chdir(cwd)
        if (both := mixed(args, _tables())) is not None:
            raise click.UsageError(both)
        command = torchrun_cli if choose_form(args, os.environ, _tables()) == TORCHRUN else cli
        command.main(args=args, prog_name="elasticrun", standalone_mode=False, obj=args)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"elasticrun: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except (ConfigError, DiscoveryError) as exc:
        click.echo(f"elasticrun: error: {exc}", err=True)
        sys.exit(2)
    except ElasticrunError as exc:
        click.echo(f"elasticrun: error: {exc}", err=True)
        sys.exit(1)
    except click.Abort:
        click.echo("elasticrun: aborted", err=True)
        sys.exit(130)
