"""By hand: launchers of torchrun's form started at the same moment on one host agree on one
driver and run one job, every time.

    python -m tests.stress.two_launchers --runs 20 [--launchers 2] [--nproc 4]

Each run starts the launchers back to back (`elasticrun --nnodes L --nproc-per-node P
--rdzv-endpoint 127.0.0.1:PORT ...`, tests/integration/launchers.py) and checks that every
launcher exits 0, that the job ran once at world size L x P (each rank's line, the
all-reduced sum of the ranks), and that nothing of it is left. Prints a line per run and
the count; exits 1 if any run was wrong.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tests.integration.harness import assert_no_orphans
from tests.integration.launchers import launch_at_once


def check(launchers: int, nproc: int, timeout: float) -> str | None:
    """One run: None when right, else what was wrong."""
    world = launchers * nproc
    with tempfile.TemporaryDirectory() as tmp:
        run = launch_at_once(Path(tmp), launchers, nproc, timeout)
    try:
        assert_no_orphans(run.tag, within=10.0)
    except AssertionError as exc:
        return str(exc)
    expected = {rank: (world, float(sum(range(world)))) for rank in range(world)}
    if run.codes != [0] * launchers or run.ranks() != expected:
        return f"ranks {sorted(run.ranks().items())}\n{run.describe()}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--launchers", type=int, default=2)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=180.0)
    options = parser.parse_args()
    good = 0
    for number in range(1, options.runs + 1):
        started = time.monotonic()
        wrong = check(options.launchers, options.nproc, options.timeout)
        good += wrong is None
        took = time.monotonic() - started
        print(f"run {number}: {'ok' if wrong is None else 'WRONG'} ({took:.1f}s)", flush=True)
        if wrong is not None:
            print(wrong, flush=True)
    print(f"{good} of {options.runs} runs: one job at world size "
          f"{options.launchers * options.nproc}", flush=True)
    return 0 if good == options.runs else 1


if __name__ == "__main__":
    sys.exit(main())
