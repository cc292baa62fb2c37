"""When the driver dies or hangs, no worker is left waiting for it."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tests.integration.harness import (
    PYTHON,
    SCRIPTS,
    assert_no_orphans,
    read_records,
    start_job,
    tagged_pids,
)


def wait_for(what: str, check, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_killed_driver_takes_its_local_workers_along() -> None:
    """A plain command that never talks to the driver: the parent-death signal ends it."""
    proc, tag = start_job(["-np", "2", PYTHON, "-c", "import time; time.sleep(600)"])
    wait_for("two workers", lambda: len(set(tagged_pids(tag)) - {proc.pid}) == 2)
    proc.kill()
    proc.communicate(timeout=30)
    assert_no_orphans(tag, within=5)


def test_killed_driver_takes_its_forked_workers_and_their_template_along(tmp_path: Path
                                                                         ) -> None:
    """Python workers are forked from a worker template: the driver's SIGKILL ends the
    template (its parent-death signal), and the template's end ends the workers."""
    progress = tmp_path / "progress"
    env = {"TRAIN_SAMPLES": "4096", "TRAIN_EPOCHS": "1", "TRAIN_STEP_SLEEP": "0.05",
           "LOG_DIR": str(tmp_path), "PROGRESS_FILE": str(progress)}
    proc, tag = start_job(["-np", "2", PYTHON, str(SCRIPTS / "elastic_train.py")], env)
    wait_for("step 2", lambda: progress.exists() and
             json.loads(progress.read_text() or "[0]")[0] >= 2)
    workers = {r["pid"] for r in read_records(tmp_path)}
    template = set(tagged_pids(tag)) - workers - {proc.pid}
    assert len(workers) == 2 and len(template) == 1  # forked, not exec'd
    proc.kill()
    proc.communicate(timeout=30)
    assert_no_orphans(tag, within=5)


def test_killed_driver_takes_a_running_discovery_script_along(tmp_path: Path) -> None:
    """A driver SIGKILLed while its discovery script runs (here: one that hangs from its
    second call on) leaves no script behind (the script's parent-death signal)."""
    calls = tmp_path / "calls"
    script = tmp_path / "discover.py"
    script.write_text(f"""#!{PYTHON}
import pathlib, time
calls = pathlib.Path({str(calls)!r})
calls.write_text(calls.read_text() + "x" if calls.exists() else "x")
if len(calls.read_text()) > 1:
    time.sleep(600)
print("localhost:1")
""")
    script.chmod(0o755)
    proc, tag = start_job(["-np", "1", "--host-discovery-script", str(script),
                           "--discovery-interval", "0.2", "--discovery-timeout", "600",
                           PYTHON, "-c", "import time; time.sleep(600)"])
    wait_for("a hanging discovery call", lambda: calls.exists() and len(calls.read_text()) > 1)
    proc.kill()
    proc.communicate(timeout=30)
    assert_no_orphans(tag, within=5)


def test_workers_stop_when_the_driver_stops_answering(tmp_path: Path) -> None:
    """A driver that hangs (here: SIGSTOP) closes nothing; the workers notice its silence
    within --driver-timeout and stop, saying why."""
    progress = tmp_path / "progress"
    env = {"TRAIN_SAMPLES": "4096", "TRAIN_EPOCHS": "1", "TRAIN_BATCH": "4",
           "TRAIN_STEP_SLEEP": "0.05", "LOG_DIR": str(tmp_path), "PROGRESS_FILE": str(progress)}
    # With nothing kept: with host snapshots, the driver that wakes up would restart the job
    # from its last commit (test_total_loss.py), which is not what this test is about.
    proc, tag = start_job(["-np", "2", "--driver-timeout", "3", "--no-host-snapshots",
                           PYTHON, str(SCRIPTS / "elastic_train.py")], env)
    try:
        wait_for("step 3", lambda: progress.exists() and
                 json.loads(progress.read_text() or "[0]")[0] >= 3)
        workers = {r["pid"] for r in read_records(tmp_path)}  # what they logged
        assert len(workers) == 2 and workers <= set(tagged_pids(tag))
        os.kill(proc.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        wait_for("the workers to stop", lambda: not (set(tagged_pids(tag)) & workers),
                 timeout=30)
        # Poll window (timeout / 2) + the timeout, with room for a loaded machine.
        assert time.monotonic() - stopped_at < 15
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "the driver is gone, so this worker stops" in err
    assert_no_orphans(tag)
