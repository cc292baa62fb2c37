"""Safety nets for every test.

- A job a failed test left running is killed before the next test starts, so one failure
  cannot load the machine (and fail unrelated tests) for minutes. Only this session's jobs:
  another pytest run on the same machine is left alone. Tests that care assert that nothing
  is left behind themselves; this only cleans up.
- Process-wide state a test changed and did not give back (signal handlers, environment,
  working directory, event loop policy, logging, torch's default group: process_state.py)
  fails that test, and is put back, so no test depends on what ran before it.
- The host snapshots of jobs whose driver a test killed outright (a driver keeps them for a
  --resume: docs/guides/total-loss.md) are removed when the whole run ends."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import process_state
from tests.integration.harness import tagged_pids


@pytest.fixture(autouse=True)
def _process_state_given_back() -> Iterator[None]:
    before = process_state.snapshot()
    yield
    changed = process_state.restore(before)
    if changed:
        pytest.fail("the test left process-wide state changed (now put back): "
                    + "; ".join(changed), pytrace=False)


@pytest.fixture(autouse=True)
def _kill_jobs_left_running() -> Iterator[None]:
    yield
    left = tagged_pids(None)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if left:
        print(f"conftest: killed {len(left)} process(es) a test left running", file=sys.stderr)


_SHARED_MEMORY = Path("/dev/shm")
_SNAPSHOTS = f"elasticrun-{os.getuid()}-*"
_snapshots_before: set[Path] = set()


def pytest_sessionstart(session: pytest.Session) -> None:
    _snapshots_before.update(_SHARED_MEMORY.glob(_SNAPSHOTS))


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        return  # a pytest-xdist worker: the others may still run jobs; the controller cleans
    for directory in set(_SHARED_MEMORY.glob(_SNAPSHOTS)) - _snapshots_before:
        shutil.rmtree(directory, ignore_errors=True)
