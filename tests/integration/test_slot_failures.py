"""A dead worker costs its slot for a moment, not its host: real jobs, real kills.

The survivors (its host's other workers too) keep their processes and roll back; the slot
gets a new worker forked from the host's template; a slot or host is blacklisted only when
its workers keep failing."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

from tests.integration.harness import (
    PYTHON,
    REPO,
    SCRIPTS,
    assert_no_orphans,
    run_job,
    start_job,
)
from tests.integration.progress import check_job

TRAIN = [PYTHON, str(SCRIPTS / "elastic_train.py")]
COMMON = ["--start-timeout", "60"]


def train_env(faults: str = "", epochs: int = 3, **extra: str) -> dict[str, str]:
    return {"TRAIN_SAMPLES": "64", "TRAIN_EPOCHS": str(epochs), "TRAIN_BATCH": "4",
            "TRAIN_STEP_SLEEP": "0.02", "FAULTS": faults, **extra}


def pids_of_rank(views: list, rank: int) -> list[int]:
    return [next(pid for pid, r in view.ranks_by_pid.items() if r == rank) for view in views]


def test_the_first_jobs_script_goes_on_after_a_kill_with_its_survivor_and_a_new_worker(
        tmp_path: Path) -> None:
    """docs/getting-started/first-job.md, as a user runs it: `elasticrun -np 2 python
    train.py` on one machine, rank 1 SIGKILLed mid-training."""
    doc = (REPO / "docs" / "getting-started" / "first-job.md").read_text()
    match = re.search(r"Save this as `train.py`.*?```python\n(.*?)```", doc, re.S)
    assert match, "the first job's script is not in its page"
    (tmp_path / "train.py").write_text(match.group(1).replace("time.sleep(0.05)",
                                                              "time.sleep(0.01)"))
    proc, tag = start_job(["-np", "2", PYTHON, "train.py"], cwd=tmp_path)
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        victim = None
        while victim is None or not any("epoch 1 " in line for line in lines):
            assert time.monotonic() < deadline, "".join(lines)
            lines.append(proc.stdout.readline())
            if found := re.search(r"\[1\]<stdout>:rank 1 of 2: pid (\d+)", lines[-1]):
                victim = int(found.group(1))
        os.kill(victim, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_no_orphans(tag)
    out = "".join(lines) + stdout
    assert proc.returncode == 0, stderr[-3000:]
    starts = re.findall(r"\[(\d)\]<stdout>:rank (\d) of 2: pid (\d+)", out)
    assert len(starts) == 3 and starts[2][:2] == ("1", "1"), (starts, stderr)  # one new rank 1
    # (an epoch's line comes again when the kill rolled back past it)
    epochs = re.findall(r"epoch (\d+) .* world size (\d)", out)
    assert sorted({int(e) for e, _ in epochs}) == list(range(10))
    assert {s for _, s in epochs} == {"2"}
    assert "slot localhost[1] gets a new worker" in stderr
    assert "round 2: world size 2 on localhost:2 (1 new worker(s))" in stderr


def test_one_machine_goes_on_through_crash_after_crash(tmp_path: Path) -> None:
    """-np 2 on one host, default flags: rank 1 is killed five times. Each time its
    neighbour keeps its process and a new worker takes the slot; every sample of every
    epoch is trained exactly once, and the job ends rc 0 at world size 2."""
    kills = ",".join(f"{step}:1:sigkill" for step in (3, 7, 11, 15, 19))
    result = run_job(["-np", "2", *COMMON, *TRAIN], train_env(kills, epochs=3),
                     log_dir=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    views = check_job(result.records, samples=64, epochs=3)
    assert len(result.events("fault")) == 5
    assert {v.size for v in views} == {2}
    assert len(set(pids_of_rank(views, 0))) == 1  # the neighbour: one process throughout
    assert len(set(pids_of_rank(views, 1))) == 6  # the first and five new ones
    assert "blacklisted" not in result.stderr
    assert result.stderr.count("slot localhost[1] gets a new worker") == 5


def test_two_hosts_default_flags_three_kills_end_at_full_size(tmp_path: Path) -> None:
    """4 workers on two hosts, no --min-np: three workers killed one after another on both
    hosts; the survivors wait for each new worker, and the job ends at world size 4 with
    the worker never killed in the same process throughout."""
    result = run_job(["-np", "4", "-H", "localhost:2,127.0.0.1:2", *COMMON, *TRAIN],
                     train_env("2:3:sigkill,5:1:sigkill,8:2:sigkill", epochs=4),
                     log_dir=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    views = check_job(result.records, samples=64, epochs=4)
    assert len(result.events("fault")) == 3 and {v.size for v in views} == {4}
    killed = {r["pid"] for r in result.events("fault")}
    never_killed = set(views[0].ranks_by_pid) - killed
    assert len(never_killed) == 1 and all(never_killed <= set(v.ranks_by_pid) for v in views)
    hosts = re.findall(r"slot (\S+)\[\d\] gets a new worker", result.stderr)
    assert sorted(set(hosts)) == ["127.0.0.1", "localhost"]


def test_a_host_whose_workers_fail_at_every_start_is_left_out_and_the_job_goes_on(
        tmp_path: Path) -> None:
    """127.0.0.1's workers die at step 3, and every new one there fails at its start: the
    host is blacklisted after 3 failures on its 2 slots (and again after each short
    cooldown); the job trains on localhost and ends rc 0."""
    result = run_job(["-H", "localhost:2,127.0.0.1:2", "--min-np", "2",
                      "--blacklist-cooldown-range", "1", "2", *COMMON, *TRAIN],
                     train_env("3:2:exit,3:3:exit", epochs=3, TRAIN_SLOW_BELOW="4",
                               TRAIN_FAIL_AT_START="127.0.0.1:1000"),
                     log_dir=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    views = check_job(result.records, samples=64, epochs=3)
    assert views[-1].size == 2 and set(views[-1].hosts_by_rank.values()) == {"localhost"}
    assert "host 127.0.0.1 failed (" in result.stderr
    assert "on 2 of its slots); blacklisted for" in result.stderr
    assert "slot localhost" not in result.stderr  # nothing charged to the healthy host


def test_a_slot_that_keeps_failing_is_left_out_alone(tmp_path: Path) -> None:
    """127.0.0.1's second slot (a dead GPU) fails at every start: it is blacklisted alone,
    the host's first slot trains on, and the job ends rc 0 at world size 3."""
    result = run_job(["-H", "localhost:2,127.0.0.1:2", "--min-np", "2", *COMMON, *TRAIN],
                     train_env("3:3:exit", epochs=3, TRAIN_SLOW_BELOW="4",
                               TRAIN_FAIL_AT_START="127.0.0.1[1]:1000"),
                     log_dir=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    views = check_job(result.records, samples=64, epochs=3)
    assert views[-1].size == 3
    assert sorted(views[-1].hosts_by_rank.values()) == ["127.0.0.1", "localhost", "localhost"]
    assert "slot 127.0.0.1[1] blacklisted for" in result.stderr
    assert "host 127.0.0.1 failed" not in result.stderr
