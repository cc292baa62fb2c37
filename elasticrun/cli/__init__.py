"""The `elasticrun` command line: entry.py chooses the form; one module per command form
(horovodrun.py: elasticrun's own `-np` form; torchrun.py: torchrun's) and per subcommand
(agent.py, status.py). This face hands on what users and tests import, lazily: `elasticrun
agent` imports elasticrun.cli.agent, and must not pay for the driver's imports."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from elasticrun.protocol import ENV_EVENT_SECRET, ENV_WEBHOOK_TOKEN

if TYPE_CHECKING:
    from elasticrun.cli.entry import main
    from elasticrun.cli.horovodrun import cli

__all__ = ["ENV_EVENT_SECRET", "ENV_WEBHOOK_TOKEN", "cli", "main"]


def __getattr__(name: str) -> Any:
    if name == "cli":
        from elasticrun.cli.horovodrun import cli

        return cli
    if name == "main":
        from elasticrun.cli.entry import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
