"""Safety nets for every test.

- A job a failed test left running is killed before the next test starts, so one failure
  cannot load the machine (and fail unrelated tests) for minutes. Only this session's jobs:
  another pytest run on the same machine is left alone. Tests that care assert that nothing
  is left behind themselves; this only cleans up.
- Process-wide state a test changed and did not give back (signal handlers, environment,
  working directory, event loop policy, logging, torch's default group: process_state.py)
  fails that test, and is put back, so no test depends on what ran before it."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator

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
