"""A job that loses every worker at once goes on from its last kept commit (issue 56).

Real jobs on this machine: every worker SIGKILLed (or raising) at the same step, the job
restarted by the driver from the host snapshot; the same job with nothing kept in memory,
only --checkpoint-dir; the whole job (driver and workers) killed and its command run again.
The training script's records (tests/integration/progress.py) prove exactly-once samples and
that each round resumed from a state, model and optimizer, that was committed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch

from tests.integration.harness import (
    PYTHON,
    SCRIPTS,
    assert_no_orphans,
    read_records,
    run_job,
    start_job,
    tagged_pids,
)
from tests.integration.progress import check_job

TRAIN = str(SCRIPTS / "elastic_train.py")
SMALL = {"TRAIN_SAMPLES": "64", "TRAIN_EPOCHS": "3", "TRAIN_BATCH": "4"}


def _committed(records: list[dict]) -> set[tuple[int, str, str]]:
    return {(r["step"], r["hash"], r["optimizer_hash"]) for r in records if r["event"] == "step"}


def _round_starts(records: list[dict], number: int) -> set[tuple[int, str, str]]:
    return {(r["step"], r["hash"], r["optimizer_hash"]) for r in records
            if r["event"] == "round" and r["round"] == number}


def _snapshot_dirs() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("elasticrun-")}


def _job_snapshot_dir(stderr: str) -> Path:
    job_id = re.search(r"elasticrun: job ([0-9a-f]+):", stderr)
    assert job_id, stderr[-2000:]
    return Path("/dev/shm", f"elasticrun-{os.getuid()}-{job_id.group(1)}")


def _wait_for_step(progress: Path, step: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if json.loads(progress.read_text())[0] >= step:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    raise AssertionError(f"training did not reach step {step} in {timeout:g}s")


def _kill_every_worker(log_dir: Path) -> int:
    """SIGKILLs, at once, every training process that logged a start and still runs."""
    pids = {r["pid"] for r in read_records(log_dir) if r["event"] == "start"}
    killed = 0
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    return killed


def test_every_worker_killed_at_once_goes_on_from_the_host_snapshot(tmp_path: Path) -> None:
    progress = tmp_path / "progress"
    env = {**SMALL, "TRAIN_STEP_SLEEP": "0.05", "PROGRESS_FILE": str(progress),
           "LOG_DIR": str(tmp_path)}
    proc, tag = start_job(["-np", "2", PYTHON, TRAIN], env)
    try:
        _wait_for_step(progress, 5)
        assert _kill_every_worker(tmp_path) == 2
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert_no_orphans(tag)
    assert proc.returncode == 0, stderr[-3000:]
    records = list(read_records(tmp_path))
    views = check_job(records, samples=64, epochs=3)
    # (a round may open, and break, between the two workers' exits: no worker trains in it)
    assert len(views) == 2
    (start,) = _round_starts(records, views[1].number)  # both ranks from the same state
    assert start in _committed(records)  # model and optimizer bitwise a committed state
    last = max(r["step"] for r in records if r["event"] == "step" and r["round"] == 1)
    # The last commit or the one before (a step is logged just before its commit: the last
    # logged one may not have been committed when the kill came).
    assert last - 2 <= start[0] <= last
    assert "every worker holding the committed training state was lost" in stderr
    assert re.search(r"round \d+: restored from the snapshot of commit", stderr)
    assert "(host localhost)" in stderr
    assert not _job_snapshot_dir(stderr).exists()  # the job's snapshots went with it


def test_every_rank_raising_once_at_the_same_step_goes_on(tmp_path: Path) -> None:
    """Each rank raises once at step 6 (a rank whose round broke before it got there raises
    in a later round instead): every round after the first starts from a commit, the newest
    host snapshot (written at the cadence that keeps snapshots within 2% of the time:
    every commit, or every k-th where a write costs more)."""
    result = run_job(["-np", "2", PYTHON, TRAIN], {**SMALL, "FAULTS": "6:all:exception"},
                     log_dir=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    views = check_job(result.records, samples=64, epochs=3)
    assert len(views) >= 2
    for view in views[1:]:
        (start,) = _round_starts(result.records, view.number)
        assert start in _committed(result.records) and 1 <= start[0] <= 5


def test_every_rank_raising_every_time_ends_the_job_naming_the_error(tmp_path: Path) -> None:
    """'*': the fault fires once in each process, so every restarted worker raises again."""
    result = run_job(["-np", "2", "--max-restarts", "2", PYTHON, TRAIN],
                     {**SMALL, "FAULTS": "6:*:exception"}, log_dir=tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "no restart is left (--max-restarts 2)" in result.stderr
    assert "ValueError: injected fault at step 6" in result.stderr
    rounds = {r["round"] for r in result.records if r["event"] == "round"}
    assert len(rounds) == 3 and min(rounds) == 1  # the first and two restarts, from snapshots


def test_only_a_checkpoint_dir_is_enough(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    logs = tmp_path / "logs"
    result = run_job(["-np", "2", "--no-host-snapshots", "--checkpoint-dir", str(checkpoints),
                      "--checkpoint-interval", "0", PYTHON, TRAIN],
                     {**SMALL, "FAULTS": "7:all:sigkill", "TRAIN_STEP_SLEEP": "0.05"},
                     log_dir=logs)
    assert result.returncode == 0, result.stderr[-3000:]
    views = check_job(result.records, samples=64, epochs=3)
    (start,) = _round_starts(result.records, views[1].number)
    assert start in _committed(result.records)
    assert "restored from the snapshot of commit" in result.stderr
    assert f"(checkpoint dir {checkpoints}" in result.stderr
    # The last commit was written at the job's end, and only it is kept.
    files = sorted(p.name for p in checkpoints.iterdir())
    assert len(files) == 1 and files[0].endswith(".whole.pt"), files
    content = torch.load(checkpoints / files[0], weights_only=False)
    final = [r for r in result.records if r["event"] == "final"]
    assert content["objects"]["step"] == final[0]["step"]


def test_the_whole_job_killed_and_run_again_resumes_from_its_checkpoint_dir(
        tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    first_logs, second_logs = tmp_path / "first", tmp_path / "second"
    first_logs.mkdir()
    progress = tmp_path / "progress"
    args = ["-np", "2", "--checkpoint-dir", str(checkpoints), "--checkpoint-interval", "0",
            PYTHON, TRAIN]
    env = {**SMALL, "TRAIN_STEP_SLEEP": "0.05", "PROGRESS_FILE": str(progress)}
    proc, tag = start_job(args, {**env, "LOG_DIR": str(first_logs)})
    try:
        _wait_for_step(progress, 12)
    finally:
        for pid in [proc.pid, *tagged_pids(tag)]:  # driver and workers, at once
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, stderr = proc.communicate(timeout=30)
        # kept for a --resume that will not come
        shutil.rmtree(_job_snapshot_dir(stderr), ignore_errors=True)
    assert_no_orphans(tag)
    first = list(read_records(first_logs))
    result = run_job(args, env, log_dir=second_logs)
    assert result.returncode == 0, result.stderr[-3000:]
    (start,) = _round_starts(result.records, 1)
    assert start[0] >= 10 and start in _committed(first), start
    assert "round 1: restored from the snapshot of commit" in result.stderr
    final = [r for r in result.records if r["event"] == "final"]
    assert final and final[0]["epoch"] == 3


def test_a_checkpoint_of_another_model_is_refused_in_one_line(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    other = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    optimizer = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    torch.save({"format": "elasticrun-commit", "version": 1, "commit": 9, "holding": "whole",
                "model": other.state_dict(), "optimizer": optimizer.state_dict(),
                "objects": {"step": 9}}, checkpoints / "commit-000000000009.whole.pt")
    result = run_job(["-np", "2", "--checkpoint-dir", str(checkpoints), PYTHON, TRAIN],
                     SMALL, log_dir=tmp_path / "logs")
    assert result.returncode == 1
    line = ("CheckpointMismatchError: cannot restore commit 9 from "
            f"{checkpoints / 'commit-000000000009.whole.pt'}: model parameter '0.weight' is "
            "[32, 8] float32 in the file, [16, 8] float32 in this model")
    assert line in result.stderr, result.stderr[-3000:]
    assert not [r for r in result.records if r["event"] == "step"]  # nothing trained


@pytest.mark.parametrize("flag", ["--checkpoint-interval"])
def test_a_negative_checkpoint_interval_is_one_line(flag: str, tmp_path: Path) -> None:
    result = run_job(["-np", "1", flag, "-1", PYTHON, "-c", "pass"], timeout=60)
    assert result.returncode == 2
    assert "--checkpoint-interval" in result.stderr and "Traceback" not in result.stderr


OBJECT_STATE_ONLY = """
import os, signal
import elasticrun.torch as er
er.init()
state = er.elastic.ObjectState(step=0)

@er.elastic.run
def train(state):
    while state.step < 20:
        state.step += 1
        if state.step == 3 and not os.environ.get("ELASTICRUN_RESTORE"):
            # every worker of the first round, before step 3's commit: none can complete it
            # and go on alone (killed after it, a slower peer's commit could fail first)
            os.kill(os.getpid(), signal.SIGKILL)
        state.commit()

train(state)
"""


def test_a_total_loss_with_no_snapshot_to_go_on_from_ends_the_job_at_once(
        tmp_path: Path) -> None:
    """An ObjectState keeps no snapshot: the restarted round says so and the job ends then,
    not after every restart --max-restarts allows."""
    script = tmp_path / "objects.py"
    script.write_text(OBJECT_STATE_ONLY)
    result = run_job(["-np", "2", PYTHON, str(script)], timeout=90)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "restart 1 of 3" in result.stderr and "restart 2 of 3" not in result.stderr
    assert "SnapshotMissingError: every worker holding the committed state was lost, and an " \
           "ObjectState keeps no snapshot" in result.stderr
    assert "the job cannot go on from its committed state" in result.stderr


TWO_STATES = """
import torch
import elasticrun.torch as er
er.init()
model = torch.nn.Linear(2, 2)
first = er.elastic.TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), step=0)

@er.elastic.run
def train(state):
    for _ in range(3):
        state.step += 1
        state.commit()

train(first)
second = er.elastic.TorchState(batch=20)  # a state made later, in the same process

@er.elastic.run
def check(state):
    print("second state after its sync:", state.batch, flush=True)

check(second)
"""


def test_a_state_made_later_never_restores_another_states_commits(tmp_path: Path) -> None:
    """Kept commits are named by the state's place among the process's TorchStates: the
    second one's first sync finds none of its own (Horovod's tests make one per test)."""
    script = tmp_path / "two_states.py"
    script.write_text(TWO_STATES)
    result = run_job(["-np", "2", PYTHON, str(script)], timeout=90)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("second state after its sync: 20") == 2, result.stdout
    assert "restored" not in result.stderr
