"""A safety net for every test: a job a failed test left running is killed before the next
test starts, so one failure cannot load the machine (and fail unrelated tests) for minutes.
Only this session's jobs: another pytest run on the same machine is left alone.

Tests that care assert that nothing is left behind themselves; this only cleans up."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator

import pytest

from tests.integration.harness import tagged_pids


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
