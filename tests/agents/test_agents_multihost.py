"""Agents on real separate hosts: network namespaces on one bridge (tests/ssh/netns.py), no
sshd anywhere. The driver runs in the launcher namespace; each agent in its host's, and
connects out to the driver; workers talk Gloo across the bridge.

One job grows as agents join, survives a worker's SIGKILL and an agent's SIGKILL in-process;
another drains a host on its agent's SIGTERM with no rollback, then loses its driver to a
SIGKILL: the agent left stops its workers within its grace; a third loses its driver and
gets it back (--resume), its workers taken back across the bridge. Nothing is left behind.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agents.harness import TRAIN, AgentJob, train_env
from tests.integration.progress import check_job, rounds
from tests.ssh.netns import LAUNCHER_IP, Cluster, kill_all, netns_inode, unavailable

H1, H2, H3 = "10.77.0.11", "10.77.0.12", "10.77.0.13"
COMMON = ["--start-timeout", "60", "--discovery-interval", "0.2", "--network-interface",
          "eth0"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = unavailable(sshd=False)
    if reason is not None:
        pytest.skip(f"agents on separate hosts need network namespaces: {reason}")
    built = Cluster.create(tmp_path_factory.mktemp("agents"), n_hosts=3, sshd=False)
    try:
        yield built
    finally:
        built.destroy()


@pytest.fixture
def job_box(cluster: Cluster) -> Iterator[list[AgentJob]]:
    jobs: list[AgentJob] = []
    yield jobs
    for job in jobs:
        job.kill_all()
    left = cluster.wait_for_no_strays(within=15.0)
    kill_all(list(left))
    assert not left, f"processes left in the cluster's namespaces: {left}"


def new_job(cluster: Cluster, tmp: Path, args: list[str], env: dict[str, str]) -> AgentJob:
    return AgentJob(tmp, [*args, *COMMON, *TRAIN], env, ns=cluster.launcher,
                    driver_addr=LAUNCHER_IP)


def test_job_grows_and_survives_a_worker_and_an_agent_killed(
        cluster: Cluster, tmp_path: Path, job_box: list[AgentJob]) -> None:
    stop = tmp_path / "stop"
    env = train_env(tmp_path / "logs", tmp_path / "progress", epochs=1000, sleep=0.1,
                    stop_file=stop)
    job = new_job(cluster, tmp_path, ["--min-np", "2", "--max-np", "4"], env)
    job_box.append(job)
    job.start_agent(H1, 2, ns=cluster.host(H1).ns)
    job.wait_until("step 2 at size 2", lambda: job.step() >= (2, 2))
    job.start_agent(H2, 1, ns=cluster.host(H2).ns)
    job.start_agent(H3, 1, ns=cluster.host(H3).ns)
    job.wait_until("size 4", lambda: job.step()[1] == 4)
    h1_workers = sorted(job.workers_on(H1))
    h3_net = netns_inode(cluster.host(H3).ns)
    [victim] = job.workers_on(H3)
    assert os.stat(f"/proc/{victim}/ns/net").st_ino == h3_net  # it runs on H3
    before_kill = job.step()[0]
    os.kill(victim, signal.SIGKILL)  # its slot gets a new worker, from H3's agent
    # A step at size 4 two past the kill is the new worker's round: the victim is dead. (The
    # survivors train at size 3 meanwhile only when the new worker is not ready when they
    # roll back.)
    job.wait_until("a new worker on H3, at size 4",
                   lambda: job.workers_on(H3) not in ([], [victim])
                   and job.step()[1] == 4 and job.step()[0] > before_kill + 2)
    [refill] = job.workers_on(H3)
    os.kill(job.agents[H2].pid, signal.SIGKILL)  # `ip netns exec` execs: the agent itself
    job.wait_until("size 3", lambda: job.step()[1] == 3)
    stop.touch()
    result = job.finish()
    views = check_job(result.records, samples=64, epochs=None)
    assert [v.size for v in views][:2] == [2, 4] and views[-1].size == 3
    assert any(v.size == 4 and refill in v.ranks_by_pid for v in views[2:-1])
    assert refill in views[-1].ranks_by_pid and victim not in views[-1].ranks_by_pid
    assert sorted(set(views[-1].hosts_by_rank.values())) == sorted({H1, H3})
    # The H1 workers recovered in-process: the same processes from the first round to the last.
    assert sorted(views[0].ranks_by_pid) == h1_workers
    assert set(h1_workers) <= set(views[-1].ranks_by_pid)
    assert f"slot {H3}[0] gets a new worker" in result.stderr
    assert f"host {H2} failed" in result.stderr and f"host {H3} failed" not in result.stderr
    assert f"agent for host {H2} is gone" in result.stderr
    assert job.wait_agent(H2) == -signal.SIGKILL
    assert job.wait_agent(H1) == 0 and job.wait_agent(H3) == 0  # the job's end
    job.close()


def test_drain_on_sigterm_then_the_driver_dies_and_the_agents_stop_their_workers(
        cluster: Cluster, tmp_path: Path, job_box: list[AgentJob]) -> None:
    env = train_env(tmp_path / "logs", tmp_path / "progress", epochs=40, sleep=0.1)
    job = new_job(cluster, tmp_path, ["-np", "2", "--min-np", "1", "--max-np", "2"], env)
    job_box.append(job)
    grace = 3.0
    for host in (H1, H2):
        job.start_agent(host, 1, ns=cluster.host(host).ns,
                        extra=["--driver-grace", f"{grace:g}"])
    job.wait_until("step 3 at size 2", lambda: job.step() >= (3, 2))
    os.kill(job.agents[H2].pid, signal.SIGTERM)  # e.g. the pod is evicted
    assert job.wait_agent(H2) == 0, job.agent_log(H2)
    assert "drained: every worker has left" in job.agent_log(H2)
    job.wait_until("size 1 and two more steps", lambda: job.step()[1] == 1)
    reached = job.step()[0]
    job.wait_until("training goes on", lambda: job.step()[0] >= reached + 2)
    assert job.workers_on(H1)
    job.proc.kill()  # the driver dies: no chance to tell anyone
    killed = time.monotonic()
    assert job.wait_agent(H1, timeout=grace + 15) == 1, job.agent_log(H1)
    assert time.monotonic() - killed < grace + 10
    assert "has not answered for 3s: stopping 1 worker(s)" in job.agent_log(H1)
    result = job.finish(ok=False)
    views = rounds(result.records)  # the job did not finish: rounds, not check_job
    assert [v.size for v in views] == [2, 1]
    assert not result.events("restore"), "the drain rolled back"
    job.close()


def test_a_killed_driver_resumes_and_its_agents_hand_their_workers_back(
        cluster: Cluster, tmp_path: Path, job_box: list[AgentJob]) -> None:
    """The driver's host loses it (SIGKILL) while agents on two other hosts train on; the
    same command line with --resume, on the same host and port, takes every worker back
    across the bridge: the same processes, no rollback."""
    stop = tmp_path / "stop"
    env = train_env(tmp_path / "logs", tmp_path / "progress", epochs=1000, sleep=0.1,
                    stop_file=stop)
    args = ["--min-np", "2", "--state-dir", str(tmp_path / "state")]
    job = new_job(cluster, tmp_path, args, env)
    job_box.append(job)
    for host in (H1, H2):
        job.start_agent(host, 1, ns=cluster.host(host).ns, extra=["--driver-grace", "60"])
    job.wait_until("step 3 at size 2", lambda: job.step() >= (3, 2))
    pids = sorted(job.workers_on(H1) + job.workers_on(H2))
    first = job.proc
    first.kill()
    first.communicate()
    lost_at = job.step()[0]
    deadline = time.monotonic() + 30
    while job.step()[0] < lost_at + 3:  # the workers train on without a driver
        assert time.monotonic() < deadline, "training stopped with the driver"
        time.sleep(0.05)
    job.start_driver(["--resume", *args, *COMMON, *TRAIN])
    resumed_at = job.step()[0]
    job.wait_until("training under it", lambda: job.step()[0] >= resumed_at + 3)
    stop.touch()
    result = job.finish()
    assert "driver restarted (epoch 2): re-adopted 2 of 2 worker(s)" in result.stderr
    views = check_job(result.records, samples=64, epochs=None)
    assert [v.size for v in views] == [2]
    assert not result.events("restore")
    assert sorted(views[0].ranks_by_pid) == pids
    assert job.wait_agent(H1) == 0 and job.wait_agent(H2) == 0
    job.close()
