"""A safety net for every test: a job a failed test left running is killed before the next
test starts, so one failure cannot load the machine (and fail unrelated tests) for minutes.

Tests that care assert that nothing is left behind themselves; this only cleans up."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import TAG_VAR


def _tagged_processes() -> list[int]:
    prefix = f"{TAG_VAR}=".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if any(var.startswith(prefix) for var in (entry / "environ").read_bytes().split(b"\0")):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture(autouse=True)
def _kill_jobs_left_running() -> Iterator[None]:
    yield
    left = _tagged_processes()
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if left:
        print(f"conftest: killed {len(left)} process(es) a test left running", file=sys.stderr)
