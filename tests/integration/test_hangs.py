"""Hangs without hang detection: the collective timeout is the last resort; the job goes
on. (With hang detection, the default, see test_hung_workers.py.)"""

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
                           "--no-hang-detection", "--collective-timeout", "3", PYTHON,
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
    assert [v.size for v in views][:2] == [4, 3]  # then its slot's new worker joins
    assert "did not join round 2 within 8s" in err
    resumed = min(r["time"] for r in records
                  if r["event"] == "step" and r["round"] == views[1].number)
    # Collective timeout (3 s) + the grace for an unexplained reset + the rejoin bound
    # (3 + 5 s), with room for a loaded machine; the start timeout would be 30 s.
    assert resumed - stopped_at < 20


def test_new_workers_survive_a_peer_lost_while_their_group_is_built(tmp_path: Path) -> None:
    """Rank 0 dies after joining round 1 but before building its group; the others are
    inside er.init(), waiting for its keys. They ask for a new round instead of failing.
    (Found by the chaos soak: a worker stopped between joining and building.)"""
    env = {"TRAIN_SAMPLES": "32", "TRAIN_EPOCHS": "2", "TRAIN_BATCH": "4",
           "LOG_DIR": str(tmp_path), "CRASH_HOST": "localhost"}
    proc, tag = start_job(["-H", "localhost:1,127.0.0.1:2", "--min-np", "2",
                           PYTHON, str(SCRIPTS / "crash_after_join.py")], env)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert_no_orphans(tag)
    assert "building round 1's group failed" in err
    views = check_job(list(read_records(tmp_path)), samples=32, epochs=2)
    # localhost's new workers crash the same way (at their first build): never a member
    assert all(set(v.hosts_by_rank.values()) == {"127.0.0.1"} for v in views), views


def test_rank_0_stays_with_the_committed_state_when_a_failed_host_returns(
        tmp_path: Path) -> None:
    """Rank 0 exits; the job waits (below --min-np) for its slot's new worker. The survivor,
    not the new worker, becomes rank 0, so training resumes from the commit. (Found by the
    chaos soak, when a failed host came back with a fresh worker: state was lost.)"""
    env = {"TRAIN_SAMPLES": "32", "TRAIN_EPOCHS": "3", "TRAIN_BATCH": "4",
           "LOG_DIR": str(tmp_path), "FAULTS": "5:0:exit"}
    proc, tag = start_job(["-H", "localhost:1,127.0.0.1:1", "--min-np", "2",
                           "--blacklist-cooldown-range", "1", "1.5",
                           PYTHON, str(SCRIPTS / "elastic_train.py")], env)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert_no_orphans(tag)
    views = check_job(list(read_records(tmp_path)), samples=32, epochs=3)
    assert [v.size for v in views] == [2, 2], err[-6000:]
    assert views[1].hosts_by_rank[0] == "127.0.0.1" and views[1].resume_step == 4


def test_losing_every_worker_that_holds_the_state_with_nothing_kept_stops_the_job(
        tmp_path: Path) -> None:
    """All of the round runs on localhost, whose workers are killed at once; 127.0.0.1 is
    free (over --max-np). With no host snapshots and no --checkpoint-dir, a new round would
    start training from scratch: the job stops instead, saying so (test_total_loss.py: with
    them, it goes on)."""
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho localhost:2\necho 127.0.0.1:2\n")
    script.chmod(0o755)
    env = {"TRAIN_SAMPLES": "64", "TRAIN_EPOCHS": "3", "TRAIN_BATCH": "4",
           "LOG_DIR": str(tmp_path), "FAULTS": "4:all:sigkill"}
    proc, tag = start_job(["-np", "2", "--max-np", "2", "--host-discovery-script", str(script),
                           "--no-host-snapshots", PYTHON, str(SCRIPTS / "elastic_train.py")], env)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-3000:]
    assert_no_orphans(tag)
    assert "elasticrun: error: no worker holding the committed training state is left" in err
    assert "nothing keeps it outside them" in err
    rounds = {r["round"] for r in read_records(tmp_path) if r["event"] == "round"}
    assert rounds == {1}  # no round ever started from scratch


def test_a_leaving_worker_keeps_the_state_until_the_new_round_holds_it(tmp_path: Path) -> None:
    """localhost is removed and 127.0.0.2 added; in the new round the only other holder
    (127.0.0.1) crashes before the newcomer has the state. The leaving localhost worker was
    kept until the new round settled, so it hands the state over instead of the job
    stopping (or starting from scratch). (Found by the chaos soak, seed 11.)"""
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")
    script = tmp_path / "hosts.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    progress = tmp_path / "progress"
    env = {"TRAIN_SAMPLES": "64", "TRAIN_EPOCHS": "6", "TRAIN_BATCH": "4",
           "TRAIN_STEP_SLEEP": "0.1", "LOG_DIR": str(tmp_path), "PROGRESS_FILE": str(progress),
           "CRASH_HOST": "127.0.0.1", "CRASH_AT_BUILD": "2"}
    proc, tag = start_job(["-np", "2", "--min-np", "1", "--host-discovery-script", str(script),
                           "--discovery-interval", "0.2",
                           PYTHON, str(SCRIPTS / "crash_after_join.py")], env)
    deadline = time.monotonic() + 90
    while not (progress.exists() and json.loads(progress.read_text() or "[0]")[0] >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, "no progress"
        time.sleep(0.05)
    hosts.write_text("127.0.0.1:1\n127.0.0.2:1\n")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert_no_orphans(tag)
    views = check_job(list(read_records(tmp_path)), samples=64, epochs=6)
    handover = next(v for v in views if "127.0.0.2" in v.hosts_by_rank.values())
    assert handover.hosts_by_rank[0] == "localhost" and handover.resume_step >= 3
