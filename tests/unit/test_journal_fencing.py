"""Fence, then take over: the resumed driver's look at the driver its journal names."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticrun.driver.journal.fencing import (
    FenceFirst,
    OldDriver,
    OldDriverState,
    Refuse,
    TakeOver,
    decide,
    look,
)

OWN = 1000


@pytest.mark.parametrize(("state", "age", "expected"), [
    (OldDriverState.GONE, 0.5, TakeOver),
    (OldDriverState.GONE, 500.0, TakeOver),
    (OldDriverState.STOPPED, 0.5, FenceFirst),
    (OldDriverState.STOPPED, 500.0, FenceFirst),
    (OldDriverState.RUNNING, 0.5, Refuse),
    (OldDriverState.RUNNING, 9.9, Refuse),
    (OldDriverState.RUNNING, 10.0, FenceFirst),
])
def test_the_decision(state: OldDriverState, age: float, expected: type) -> None:
    decision = decide(OldDriver(4242, state, age), OWN)
    assert isinstance(decision, expected)
    if isinstance(decision, FenceFirst):
        assert decision.pid == 4242
    if isinstance(decision, Refuse):
        assert "pid 4242" in decision.reason and "\n" not in decision.reason


def test_its_own_pid_is_never_fenced() -> None:
    """A journal that names this very process (a pid reused across a reboot) is no rival."""
    assert isinstance(decide(OldDriver(OWN, OldDriverState.RUNNING, 0.1), OWN), TakeOver)


@pytest.fixture
def fake_driver() -> Iterator[subprocess.Popen[bytes]]:
    """A real process whose command line names elasticrun, as a driver's does."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             "elasticrun"])  # as `python -m elasticrun`
    try:
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        for _ in range(500):  # until it runs the stand-in, not the fork of this process
            if cmdline.read_bytes().endswith(b"\0elasticrun\0"):
                break
            time.sleep(0.01)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_look_sees_a_running_then_stopped_then_gone_driver(
        fake_driver: subprocess.Popen[bytes]) -> None:
    assert look(fake_driver.pid, 0.2).state is OldDriverState.RUNNING
    os.kill(fake_driver.pid, signal.SIGSTOP)
    try:
        for _ in range(200):  # the stop is asynchronous
            if look(fake_driver.pid, 0.2).state is OldDriverState.STOPPED:
                break
            time.sleep(0.01)
        assert look(fake_driver.pid, 0.2).state is OldDriverState.STOPPED
    finally:
        os.kill(fake_driver.pid, signal.SIGCONT)
    fake_driver.kill()
    fake_driver.wait()
    assert look(fake_driver.pid, 0.2).state is OldDriverState.GONE


def test_a_pid_reused_by_another_program_is_gone() -> None:
    """The journal's pid now belongs to something that is not elasticrun: no one to fence."""
    with subprocess.Popen(["sleep", "30"]) as other:
        try:
            for _ in range(500):
                if Path(f"/proc/{other.pid}/cmdline").read_bytes().startswith(b"sleep"):
                    break
                time.sleep(0.01)
            assert look(other.pid, 0.2).state is OldDriverState.GONE
        finally:
            other.kill()
