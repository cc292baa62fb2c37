"""`python -m elasticrun` and the `elasticrun` command."""

from __future__ import annotations

import gc


def main() -> None:
    # The collector is off while the command's modules import: they allocate hundreds of
    # thousands of objects and its collections meanwhile find next to nothing (a tenth of a
    # driver's start-up). Frozen afterwards, those objects are never scanned again for as
    # long as the driver runs.
    gc.disable()
    try:
        from elasticrun.cli.entry import main as run_command
    finally:
        gc.freeze()
        gc.enable()
    run_command()


if __name__ == "__main__":
    main()
