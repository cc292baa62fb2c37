"""Agents on loopback (hosts a1, a2 are names, not machines): the job grows as agents join
and ends them; a wrong token changes nothing; a driver that stops answering for less than
the agents' grace loses nothing; an agent whose worker takes longer to start than its grace
keeps hearing the driver."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.agents.harness import COMMON, TRAIN, AgentJob, train_env
from tests.integration.harness import PYTHON, SCRIPTS
from tests.integration.progress import check_job


def test_agents_join_the_job_grows_and_they_exit_0_at_its_end(
        tmp_path: Path, jobs: list[AgentJob]) -> None:
    env = train_env(tmp_path / "logs", tmp_path / "progress", epochs=4, await_size=3)
    job = AgentJob(tmp_path, ["--min-np", "2", "--max-np", "3", *COMMON, *TRAIN], env)
    jobs.append(job)
    job.start_agent("a1", 2)
    job.wait_until("step 2 at size 2", lambda: job.step() >= (2, 2))
    job.start_agent("a2", 1)
    result = job.finish()
    views = check_job(result.records, samples=64, epochs=4)
    assert [v.size for v in views] == [2, 3]
    assert set(views[-1].hosts_by_rank.values()) == {"a1", "a2"}
    assert set(views[0].ranks_by_pid) <= set(views[1].ranks_by_pid)  # kept their processes
    assert not result.events("restore")
    for host in ("a1", "a2"):
        assert job.wait_agent(host) == 0, job.agent_log(host)
        assert "the job is over (exit code 0)" in job.agent_log(host)
    assert "agent joined: host a2 with 1 slot(s)" in result.stderr
    job.close()


def test_a_wrong_token_is_refused_in_one_line_and_nothing_changes(
        tmp_path: Path, jobs: list[AgentJob]) -> None:
    env = train_env(tmp_path / "logs", tmp_path / "progress")
    job = AgentJob(tmp_path, ["--min-np", "1", *COMMON, *TRAIN], env)
    jobs.append(job)
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token-0123456789abcdef\n")
    impostor = job.start_agent("evil", 4, token_file=wrong)
    assert job.wait_agent("evil") == 2
    lines = job.agent_log("evil").strip().splitlines()
    assert lines[-1] == (f"elasticrun agent evil: error: the driver at {job.url} refused this "
                         f"agent: agent token: bad signature (is --token-file the job's agent "
                         f"token?)"), lines
    assert impostor.returncode == 2
    assert job.status()["hosts"] == []  # nothing joined
    job.start_agent("a1", 1)
    result = job.finish()
    assert [v.size for v in check_job(result.records, samples=64, epochs=3)] == [1]
    assert "refused an agent connection from 127.0.0.1: bad signature" in result.stderr
    job.close()


def test_a_driver_silent_for_less_than_the_grace_loses_nothing(
        tmp_path: Path, jobs: list[AgentJob]) -> None:
    env = train_env(tmp_path / "logs", tmp_path / "progress", epochs=6, sleep=0.05)
    job = AgentJob(tmp_path, ["--min-np", "2", *COMMON, *TRAIN], env)
    jobs.append(job)
    for host in ("a1", "a2"):
        job.start_agent(host, 1, extra=["--driver-grace", "15"])
    job.wait_until("step 3", lambda: job.step()[0] >= 3)
    pids = sorted(job.workers_on("a1") + job.workers_on("a2"))
    os.kill(job.proc.pid, signal.SIGSTOP)  # the driver neither answers nor hangs up
    time.sleep(4.0)  # more than the agents' heartbeat, less than their grace
    os.kill(job.proc.pid, signal.SIGCONT)
    result = job.finish()
    views = check_job(result.records, samples=64, epochs=6)
    assert [v.size for v in views] == [2], "a round was lost"
    assert not result.events("restore")
    assert sorted(views[0].ranks_by_pid) == pids
    for host in ("a1", "a2"):
        assert job.wait_agent(host) == 0, job.agent_log(host)
    job.close()


def test_a_worker_slower_to_start_than_the_grace_does_not_cost_the_driver(
        tmp_path: Path, jobs: list[AgentJob]) -> None:
    """The agent's first start is its worker template's (seconds of imports, tens on a
    loaded host: here 5 s more, by the interpreter). Meanwhile the agent goes on reading
    the driver's messages, so it does not take the driver's silence for its loss."""
    slow = tmp_path / "bin" / "python"  # forkable: a `python` that starts 5 s late
    slow.parent.mkdir()
    slow.write_text(f"#!/bin/sh\nsleep 5\nexec {PYTHON} \"$@\"\n")
    slow.chmod(0o755)
    env = train_env(tmp_path / "logs", tmp_path / "progress", epochs=2)
    job = AgentJob(tmp_path, ["-np", "1", *COMMON, str(slow),
                              str(SCRIPTS / "elastic_train.py")], env)
    jobs.append(job)
    job.start_agent("a1", 1, extra=["--driver-grace", "3"])
    result = job.finish()
    assert [v.size for v in check_job(result.records, samples=64, epochs=2)] == [1]
    assert job.wait_agent("a1") == 0, job.agent_log("a1")
    assert "has not answered" not in job.agent_log("a1")
    job.close()


def test_a_stopped_worker_under_an_agent_is_found_by_asking_its_agent(
        tmp_path: Path, jobs: list[AgentJob]) -> None:
    """Rank 1 stops itself: its agent answers the driver's question with its process
    state, the worker is killed there, and the job goes on at size 1."""
    env = train_env(tmp_path / "logs", tmp_path / "progress", faults="5:1:sigstop")
    job = AgentJob(tmp_path, ["-np", "2", "--min-np", "1", *COMMON, *TRAIN], env)
    jobs.append(job)
    job.start_agent("a1", 1)
    job.start_agent("a2", 1)
    result = job.finish()
    views = check_job(result.records, samples=64, epochs=3)
    assert [v.size for v in views][:2] == [2, 1]  # then its slot's new worker may join
    fault = next(r for r in result.records if r["event"] == "fault")
    assert f"rank 1 on host {fault['host']} hung: its process is stopped (SIGSTOP)" \
        in result.stderr, result.stderr
    resumed = min(r["time"] for r in result.records
                  if r["event"] == "step" and r["round"] == views[1].number)
    assert resumed - fault["time"] < 15.0
    job.close()
