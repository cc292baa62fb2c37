"""--state-dir: the driver keeps its journal while the job runs; --resume's refusals (a
restarted driver taking its workers back: tests/agents/test_driver_resume.py)."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

from elasticrun.driver.journal.files import JournalFiles
from tests.integration.harness import (
    PYTHON,
    SCRIPTS,
    assert_no_orphans,
    run_job,
    start_job,
)

TRAIN_ENV = {"TRAIN_SAMPLES": "64", "TRAIN_EPOCHS": "3", "TRAIN_BATCH": "4",
             "FAULTS": "5:1:sigkill", "TRAIN_SLOW_BELOW": "2",
             "TRAIN_FAIL_AT_START": "127.0.0.1:1000"}


def test_the_journal_holds_the_job_as_it_ended(tmp_path: Path) -> None:
    """A job on two hosts whose rank 1 is killed, and whose every new worker there fails at
    its start: the journal's last snapshot has the job stopped, in round 2 on the host left,
    the failed slot blacklisted with its failures, every worker with the rounds it joined
    and holds; the secret beside it in a 0600 file, in no snapshot."""
    state_dir = tmp_path / "state"
    result = run_job(["-H", "localhost:1,127.0.0.1:1", "--min-np", "1", "--start-timeout",
                      "60", "--state-dir", str(state_dir), PYTHON,
                      str(SCRIPTS / "elastic_train.py")], TRAIN_ENV, log_dir=tmp_path / "logs")
    assert result.returncode == 0, result.stderr[-2000:]
    snapshot = JournalFiles(state_dir).read()
    job, state = snapshot.body["job"], snapshot.body["state"]
    assert snapshot.source == "current" and job["epoch"] == 1 and job["command"][0] == PYTHON
    assert state["phase"] == "stopped" and state["round"]["number"] == 2
    [(slot, worker)] = state["round"]["members"]
    assert slot == ["localhost", 0] and worker in state["round"]["synced"]
    assert [entry[:2] for entry in state["hosts"]["slot_blacklist"]] == [["127.0.0.1", 0]]
    assert state["strikes"][0][:2] == [["127.0.0.1", 0], 3] and state["trained"] is True
    [survivor] = state["workers"]  # the failed workers are forgotten
    assert (survivor["id"], survivor["joined_round"], survivor["synced_round"],
            survivor["status"]) == (worker, 2, 2, "finished")
    secret = state_dir / job["secret_file"]
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE((state_dir / "journal.json").stat().st_mode) == 0o600
    token = secret.read_text()
    assert len(token) >= 32
    assert {path.name for path in state_dir.glob("agent-*.log")}, "no agent log to check"
    for path in state_dir.iterdir():  # the journal, the secret, the command, the agents' logs
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name
        if path != secret:
            assert token not in path.read_text()
    assert token not in result.stdout + result.stderr
    assert json.loads((state_dir / "journal.json").read_text())["format"] == 1


def test_a_state_dir_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_job(["-np", "1", "--state-dir", str(blocker / "state"), PYTHON, "-c", "pass"])
    assert result.returncode != 0
    assert result.error_lines() == [f"elasticrun: error: --state-dir {blocker / 'state'}: "
                                    f"cannot write there: Not a directory"]
    assert "Traceback" not in result.stderr


def test_resume_needs_a_state_dir_and_workers_that_outlive_their_driver(tmp_path: Path) -> None:
    alone = run_job(["-np", "1", "--resume", PYTHON, "-c", "pass"])
    assert alone.returncode == 2 and alone.error_lines() == [
        "elasticrun: error: --resume needs --state-dir DIR: the directory of the journal the "
        "job's first driver kept"]
    slurm = run_job(["-np", "1", "--launcher", "slurm", "-H", "node1:1", "--resume",
                     "--state-dir", str(tmp_path / "s"), PYTHON, "-c", "pass"])
    assert slurm.returncode == 2 and slurm.error_lines() == [
        "elasticrun: error: --resume takes back workers that outlive their driver: those of "
        "--launcher local, ssh or auto and those under elasticrun agents; --launcher slurm's "
        "workers end with it, so there would be nothing to take back"]


def test_resume_from_a_directory_with_no_journal_is_one_line(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("agent-token-for-tests-0123456789\n")
    result = run_job(["--launcher", "agent", "--agent-token-file", str(token), "--port", "1",
                      "--min-np", "1", "--resume", "--state-dir", str(tmp_path / "empty"),
                      PYTHON, "-c", "pass"])
    assert result.returncode == 1 and result.error_lines() == [
        f"elasticrun: error: cannot resume from {tmp_path / 'empty'}: no valid journal "
        f"snapshot (journal.json: missing; journal.json.old: missing)"]


def test_a_state_dir_whose_driver_still_runs_is_refused_to_a_new_job(tmp_path: Path) -> None:
    """Two jobs in one directory would write one journal: the second one is refused in one
    line and leaves the first one's journal and command line as they were; once the first
    has ended, the directory takes a new job."""
    state_dir, stop = tmp_path / "state", tmp_path / "stop"
    wait = f"import os, time\nwhile not os.path.exists({str(stop)!r}): time.sleep(0.05)"
    first, tag = start_job(["-np", "1", "--state-dir", str(state_dir), PYTHON, "-c", wait])
    try:
        deadline = time.monotonic() + 60
        while not (state_dir / "journal.json").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr
            time.sleep(0.05)
        kept = {p.name: p.read_bytes() for p in state_dir.iterdir() if p.name != "journal.json"}
        job_id = JournalFiles(state_dir).read().body["job"]["id"]
        second = run_job(["-np", "1", "--state-dir", str(state_dir), PYTHON, "-c", "pass"])
        assert second.returncode == 1 and second.error_lines() == [
            f"elasticrun: error: --state-dir {state_dir}: job {job_id}'s driver (pid "
            f"{first.pid}) is still running with it; give this job a directory of its own, "
            f"or --resume to take that job over once its driver is gone"]
        assert JournalFiles(state_dir).read().body["job"]["id"] == job_id
        for name in ("command.json", "secret"):
            assert (state_dir / name).read_bytes() == kept[name]
    finally:
        stop.touch()
        first.communicate(timeout=60)
    assert first.returncode == 0
    assert_no_orphans(tag)
    again = run_job(["-np", "1", "--state-dir", str(state_dir), PYTHON, "-c", "pass"])
    assert again.returncode == 0, again.stderr[-2000:]
    assert JournalFiles(state_dir).read().body["job"]["id"] != job_id
