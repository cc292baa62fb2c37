"""A user's own error is the user's, whatever its message says: real workers, real Gloo.

One of 4 workers raises RuntimeError("connection timed out while reading shard 17 ...")
from its training code. Its text sounds like a network failure, but it is not a failure
of elasticrun's collectives: that worker dies with its traceback, its host is
blacklisted, and the other host's workers roll back and finish. The worker tells the
driver of its error before it exits, so its round breaks at once: one reset, and the
job's root cause names the error (the old text-sniffing took it for a peer failure and
reset the job forever)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.integration.harness import PYTHON, SCRIPTS, run_job
from tests.integration.progress import check_job

MESSAGE = "connection timed out while reading shard 17 from the data lake"


def test_a_user_runtime_error_ends_its_worker_and_the_others_go_on(tmp_path: Path) -> None:
    events_path = tmp_path / "events.jsonl"
    env = {"TRAIN_SAMPLES": "64", "TRAIN_EPOCHS": "3", "TRAIN_BATCH": "4",
           "USER_ERROR_STEP": "10", "USER_ERROR_RANK": "3"}
    result = run_job(["-H", "localhost:2,127.0.0.2:2", "--min-np", "2",
                      "--start-timeout", "60", "--discovery-interval", "0.2",
                      "--event-log", str(events_path),
                      PYTHON, str(SCRIPTS / "user_error_train.py")],
                     env, log_dir=tmp_path / "logs", timeout=150)  # a hang fails the test
    assert result.returncode == 0, \
        f"job failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"

    faults = result.events("fault")
    assert [(f["step"], f["rank"], f["host"]) for f in faults] == [(10, 3, "127.0.0.2")]
    # The worker died of its own error, with its traceback.
    assert "Traceback (most recent call last)" in result.stderr
    assert f"RuntimeError: {MESSAGE}" in result.stderr
    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    failed = [e["data"] for e in events if e["type"] == "worker_failed"]
    assert [(f["host"], f["rank"], f["kind"]) for f in failed] == [("127.0.0.2", 3, "exception")]
    assert failed[0]["cause"] == f"rank 3 on host 127.0.0.2 failed: RuntimeError: {MESSAGE}"
    assert not [e for e in events if e["type"].endswith("_blacklisted")]  # one error: no

    # The other three (its host's other worker too) went on from their last commit, and
    # its slot's new worker joined them at a commit.
    started = [e["data"]["world_size"] for e in events if e["type"] == "round_started"]
    assert started[:2] == [4, 3], (started, result.stderr[-6000:])
    views = check_job(result.records, samples=64, epochs=3)
    assert sorted(views[1].hosts_by_rank.values()) == ["127.0.0.2", "localhost", "localhost"]
    assert views[1].resume_step == 9  # the last commit before step 10
    # The worker whose code raised never took its error for a peer's: it did not roll back.
    assert not [r for r in result.events("restore") if r["pid"] == faults[0]["pid"]]


def test_backend_nccl_without_a_gpu_ends_the_job_with_one_clear_line(tmp_path: Path) -> None:
    """--backend nccl where a worker cannot use NCCL: each worker says why in one line (no
    traceback) and the job ends at once, naming it; nothing is left running."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        pytest.skip("this machine can use NCCL: tests/gpu covers --backend nccl")
    result = run_job(["-np", "2", "--backend", "nccl", PYTHON, str(SCRIPTS / "device_report.py")],
                     {}, log_dir=tmp_path / "logs", timeout=60)
    assert result.returncode == 1
    why = "--backend nccl: this worker cannot use NCCL"
    assert result.stderr.count(f"elasticrun: {why}") >= 2  # once per worker, from the worker
    assert "Traceback" not in result.stderr
    assert f"exited with code 2; last lines of its stderr:\n    elasticrun: {why}" \
        in result.stderr


def test_backend_auto_on_cpus_is_gloo(tmp_path: Path) -> None:
    result = run_job(["-np", "2", PYTHON, str(SCRIPTS / "device_report.py")], {},
                     log_dir=tmp_path / "logs", timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    reports = sorted((json.loads(line.split(":", 1)[1]) for line in result.stdout.splitlines()
                      if "<stdout>:{" in line), key=lambda r: r["rank"])
    expected = "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    assert [(r["rank"], r["backend"], r["sum"]) for r in reports] == \
        [(0, expected, [3.0] * 3), (1, expected, [3.0] * 3)]
