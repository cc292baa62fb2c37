"""A worker that hangs (SIGSTOP) is found by the collective timeout; the job goes on."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tests.integration.harness import (
    PYTHON,
    SCRIPTS,
    JobResult,
    assert_no_orphans,
    read_records,
    start_job,
)
from tests.integration.progress import check_job


def test_stopped_worker_is_released_by_the_collective_timeout(tmp_path: Path) -> None:
    progress = tmp_path / "progress"
    env = {"TRAIN_SAMPLES": "64", "TRAIN_EPOCHS": "3", "TRAIN_BATCH": "4",
           "TRAIN_STEP_SLEEP": "0.05", "LOG_DIR": str(tmp_path), "PROGRESS_FILE": str(progress)}
    # The default --start-timeout (30 s) stays: a worker that was already running must
    # rejoin within the collective timeout (+5 s), not the start timeout.
    started = time.monotonic()
    proc, tag = start_job(["-H", "localhost:2,127.0.0.1:2", "--min-np", "2",
                           "--collective-timeout", "3", PYTHON,
                           str(SCRIPTS / "elastic_train.py")], env)
    deadline = time.monotonic() + 90
    while not (progress.exists() and json.loads(progress.read_text() or "[0]")[0] >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, "no progress"
        time.sleep(0.05)
    victim = next(r["pid"] for r in read_records(tmp_path)
                  if r["event"] == "round" and r["host"] == "127.0.0.1")
    os.kill(victim, signal.SIGSTOP)
    stopped_at = time.time()
    out, err = proc.communicate(timeout=120)
    result = JobResult(proc.returncode, out, err, time.monotonic() - started, time.time(), tag)
    assert result.returncode == 0, err[-3000:]
    assert_no_orphans(tag)
    records = list(read_records(tmp_path))
    views = check_job(records, samples=64, epochs=3)
    assert [v.size for v in views] == [4, 2]
    assert set(views[-1].hosts_by_rank.values()) == {"localhost"}
    assert "did not join round 2 within 8s" in err
    resumed = min(r["time"] for r in records
                  if r["event"] == "step" and r["round"] == views[-1].number)
    # Collective timeout (3 s) + the grace for an unexplained reset + the rejoin bound
    # (3 + 5 s), with room for a loaded machine; the start timeout would be 30 s.
    assert resumed - stopped_at < 20
