"""A killed driver comes back with --resume and takes its running workers back: agents on
loopback (hosts a1, a2 are names), a real SIGKILL, the same command line restarted."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.agents.harness import COMMON, TRAIN, AgentJob, train_env
from tests.integration.progress import check_job


def training(tmp_path: Path, jobs: list[AgentJob], hosts: list[str]
             ) -> tuple[AgentJob, list[str], Path]:
    """A job with a journal, one agent per host (1 slot each), trained to step 3 and until
    the stop file returns: the job, its driver's arguments, the stop file."""
    stop = tmp_path / "stop"
    env = train_env(tmp_path / "logs", tmp_path / "progress", epochs=100_000, sleep=0.05,
                    stop_file=stop)
    args = ["--min-np", str(len(hosts)), *COMMON, "--state-dir", str(tmp_path / "state"),
            *TRAIN]
    job = AgentJob(tmp_path, args, env)
    jobs.append(job)
    for host in hosts:
        job.start_agent(host, 1, extra=["--driver-grace", "60"])
    job.wait_until("step 3", lambda: job.step()[0] >= 3)
    return job, args, stop


@pytest.mark.parametrize("loss", ["killed", "stopped"])
def test_a_lost_driver_resumes_and_takes_every_worker_back(
        tmp_path: Path, jobs: list[AgentJob], loss: str) -> None:
    """Killed: SIGKILL, it says goodbye to nobody. Stopped: SIGSTOP, it still holds the port
    and would wake up in a job it no longer owns; the resumed driver fences it first."""
    job, args, stop = training(tmp_path, jobs, ["a1", "a2"])
    pids = sorted(job.workers_on("a1") + job.workers_on("a2"))
    first = job.proc
    os.kill(first.pid, signal.SIGKILL if loss == "killed" else signal.SIGSTOP)
    lost_at = job.step()[0]
    deadline = time.monotonic() + 30
    while job.step()[0] < lost_at + 5:  # the workers train on without a driver
        assert time.monotonic() < deadline, "training stopped with the driver"
        time.sleep(0.05)
    assert sorted(job.workers_on("a1") + job.workers_on("a2")) == pids

    job.start_driver(["--resume", *args])
    _, first_err = first.communicate(timeout=30)  # stopped: the resumed driver killed it
    assert first.returncode == -signal.SIGKILL
    resumed_at = job.step()[0]
    job.wait_until("steps under the resumed driver",
                   lambda: job.step()[0] >= resumed_at + 5
                   and job.status()["driver_epoch"] == 2)
    stop.touch()
    result = job.finish()
    assert "driver restarted (epoch 2): re-adopted 2 of 2 worker(s)" in result.stderr, \
        result.stderr[-3000:]
    assert "(driver epoch 1)" in first_err and "(driver epoch 2)" in result.stderr
    fenced = f"the job's old driver (pid {first.pid}) is fenced first: it is stopped"
    assert (fenced in result.stderr) == (loss == "stopped")
    assert "fewer than --min-np" not in result.stderr  # agents coming back one by one
    views = check_job(result.records, samples=64, epochs=None)
    assert [v.size for v in views] == [2], "a round was lost"
    assert not result.events("restore")
    assert sorted(views[0].ranks_by_pid) == pids  # the same processes throughout
    for host in ("a1", "a2"):
        assert job.wait_agent(host) == 0, job.agent_log(host)
    job.close()


def test_resume_is_refused_while_the_jobs_driver_runs(
        tmp_path: Path, jobs: list[AgentJob]) -> None:
    """Two drivers never run one job: a --resume beside a live driver is one line, and the
    job goes on untouched."""
    job, args, stop = training(tmp_path, jobs, ["a1"])
    second = subprocess.run(
        [*job.proc.args[:-len(args)], "--resume", *args], env=job.env, capture_output=True,
        text=True, timeout=60)
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 1 and len(lines) == 1, second.stderr
    assert lines[0].startswith("elasticrun: error: cannot resume from ") and \
        f"the job's driver (pid {job.proc.pid}) is still running" in lines[0], lines
    stop.touch()
    result = job.finish()
    assert [v.size for v in check_job(result.records, samples=64, epochs=None)] == [1]
    assert job.wait_agent("a1") == 0
    job.close()
