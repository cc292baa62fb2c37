"""SSH hosts' workers outlive a killed driver when the job keeps a journal (--state-dir):
the driver starts an agent of the job's own on each host over SSH, detached from the SSH
channel, and the workers run under it. Hosts are network namespaces with a real sshd each
(netns.py); the driver runs in the launcher namespace and is SIGKILLed there.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import assert_no_orphans, job_env, tagged_pids
from tests.integration.progress import check_job, read_progress
from tests.ssh.netns import Cluster, kill_all, netns_inode, unavailable
from tests.ssh.test_multihost import (
    COMMON,
    TRAIN,
    assert_ok,
    finish_job,
    train_env,
    wait_for_step,
    workers_on,
)

H1, H2 = "10.77.0.11", "10.77.0.12"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"multi-host tests need network namespaces and sshd: {reason}")
    built = Cluster.create(tmp_path_factory.mktemp("resume"), n_hosts=2)
    try:
        yield built
    finally:
        built.destroy()


@pytest.fixture
def tags(cluster: Cluster) -> Iterator[list[str]]:
    """The jobs' tags; after the test, nothing of theirs is left anywhere."""
    found: list[str] = []
    yield found
    for tag in found:
        kill_all(tagged_pids(tag))
    left = cluster.wait_for_no_strays(within=15.0)
    kill_all(list(left))
    assert not left, f"processes left in the cluster's namespaces: {left}"


def test_a_killed_driver_resumes_and_takes_its_ssh_workers_back(
        cluster: Cluster, tmp_path: Path, tags: list[str]) -> None:
    """SIGKILL of the driver: both SSH hosts' workers train on; the same command line with
    --resume takes them back (same processes, no rollback), their output reaches it, and
    the job's end stops the agents on both hosts."""
    logs, progress, stop = tmp_path / "logs", tmp_path / "progress", tmp_path / "stop"
    logs.mkdir()
    (tmp_path / "tmp").mkdir()
    env, tag = job_env({**train_env(cluster, epochs=100_000, sleep=0.1, progress=progress),
                        "LOG_DIR": str(logs), "TRAIN_STOP_FILE": str(stop),
                        "TMPDIR": str(tmp_path / "tmp")})
    tags.append(tag)
    args = ["-H", f"{H1}:1,{H2}:1", "--min-np", "2", "--state-dir", str(tmp_path / "state"),
            "--driver-grace", "60", *COMMON, *TRAIN]

    def driver(*extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(cluster.elasticrun([*extra, *args]), env=env, cwd=logs,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    started = time.monotonic()
    first = driver()
    try:
        wait_for_step(progress, 3, first)
        pids = sorted(workers_on(tag, H1, logs) + workers_on(tag, H2, logs))
        assert len(pids) == 2, pids
        # each under its host's agent, in its host's namespace
        assert os.stat(f"/proc/{workers_on(tag, H2, logs)[0]}/ns/net").st_ino == \
            netns_inode(cluster.host(H2).ns)
        first.kill()
        first.communicate()
        lost_at = read_progress(progress)[0]
        deadline = time.monotonic() + 30
        while read_progress(progress)[0] < lost_at + 3:  # they train on without a driver
            assert time.monotonic() < deadline, "training stopped with the driver"
            time.sleep(0.05)
        second = driver("--resume")
        resumed_at = wait_for_step(progress, read_progress(progress)[0], second)
        wait_for_step(progress, resumed_at + 3, second)
        stop.touch()
        result = finish_job(second, tag, logs, started, 120.0)
    finally:
        for proc in (first, *(() if "second" not in locals() else (second,))):
            if proc.poll() is None:
                proc.kill()
    assert_ok(result)
    assert "driver restarted (epoch 2): re-adopted 2 of 2 worker(s)" in result.stderr, \
        result.stderr[-3000:]
    views = check_job(result.records, samples=64, epochs=None)
    assert [v.size for v in views] == [2]
    assert not result.events("restore")
    assert sorted(views[0].ranks_by_pid) == pids
    finished = sorted(line.split(":", 1)[1].split(" of ")[0]
                      for line in result.stdout.splitlines() if "<stdout>:finished rank" in line)
    assert finished == ["finished rank 0", "finished rank 1"], result.stdout[-3000:]
    assert_no_orphans(tag, within=15.0)  # the agents ended with the job, on both hosts
    agent_logs = sorted(p.name for p in (tmp_path / "tmp").glob("elasticrun-agent-*.log"))
    assert [name.endswith((f"-{H1}.log", f"-{H2}.log")) for name in agent_logs] == [True, True]
    token = (tmp_path / "state" / "agent-token").read_text().strip()
    assert all(token not in (tmp_path / "tmp" / name).read_text() for name in agent_logs)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_nothing_is_left_on_the_ssh_hosts(cluster: Cluster, tmp_path: Path, tags: list[str],
                                          how: str) -> None:
    """SIGTERM of the driver stops the job: its agents and their workers end on both hosts.
    SIGKILL and no --resume: they train on for --driver-grace (3 s here), then end."""
    logs, progress = tmp_path / "logs", tmp_path / "progress"
    logs.mkdir()
    env, tag = job_env({**train_env(cluster, epochs=100_000, sleep=0.1, progress=progress),
                        "LOG_DIR": str(logs), "TMPDIR": str(tmp_path)})
    tags.append(tag)
    args = ["-H", f"{H1}:1,{H2}:1", "--min-np", "2", "--state-dir", str(tmp_path / "state"),
            "--driver-grace", "3", *COMMON, *TRAIN]
    proc = subprocess.Popen(cluster.elasticrun(args), env=env, cwd=logs,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for_step(progress, 3, proc)
        assert len(workers_on(tag, H1, logs) + workers_on(tag, H2, logs)) == 2
        proc.send_signal(15 if how == "sigterm" else 9)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == (143 if how == "sigterm" else -9), stderr[-3000:]
    left = cluster.wait_for_no_strays(within=3.0 + 20.0)
    assert not left, f"left on the hosts after the driver's {how}: {left}"
    assert_no_orphans(tag, within=5.0)


def test_an_agent_that_cannot_reach_the_driver_is_named(cluster: Cluster, tmp_path: Path,
                                                         tags: list[str]) -> None:
    """The driver listens on loopback only: the agent started on the SSH host cannot dial
    it back. The job fails in one line per host naming the address the agent dials and
    where its log is, and leaves nothing behind."""
    logs = tmp_path / "logs"
    logs.mkdir()
    env, tag = job_env({**train_env(cluster), "LOG_DIR": str(logs), "TMPDIR": str(tmp_path)})
    tags.append(tag)
    args = ["-H", f"{H1}:1", "--state-dir", str(tmp_path / "state"), "--bind", "127.0.0.1",
            "--start-timeout", "4", "--discovery-interval", "0.2", *TRAIN]
    result = subprocess.run(cluster.elasticrun(args), env=env, cwd=logs, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0
    assert f"no elasticrun agent connected for host {H1} within 4s: the agent started there " \
           f"over SSH dials http://10.77.0.2:" in result.stderr, result.stderr[-3000:]
    assert "$TMPDIR/elasticrun-agent-" in result.stderr
    assert "Traceback" not in result.stderr
