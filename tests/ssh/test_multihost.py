"""elasticrun across "machines": network namespaces on one bridge, a real sshd in each.

elasticrun runs inside a launcher namespace; the hosts 10.77.0.11.. are other namespaces,
reached over SSH (see netns.py). Real workers, real Gloo over the bridge, real failures:
a host that dies, a link that goes down, a host that joins, Ctrl-C, hosts that cannot be
reached. After each test no process may be left in any namespace of the cluster.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.integration.harness import (
    PYTHON,
    SCRIPTS,
    JobResult,
    assert_no_orphans,
    is_zombie,
    job_env,
    read_records,
    tagged_pids,
)
from tests.integration.progress import check_job
from tests.ssh.netns import Cluster, keygen, kill_all, netns_inode, unavailable

H1, H2, H3, H4, H5 = (f"10.77.0.{10 + i}" for i in range(1, 6))
TRAIN = [PYTHON, str(SCRIPTS / "elastic_train.py")]
COMMON = ["--start-timeout", "60", "--discovery-interval", "0.2"]
WORKER_LINE = re.compile(r"^\[(\d+)\]<stdout>:")


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"multi-host tests need network namespaces and sshd: {reason}")
    built = Cluster.create(tmp_path_factory.mktemp("cluster"), n_hosts=5)
    try:
        yield built
    finally:
        built.destroy()


@pytest.fixture(autouse=True)
def nothing_left(cluster: Cluster) -> Iterator[None]:
    """Every test starts and ends with no process in the cluster but the sshd listeners."""
    assert not cluster.strays(), f"processes left by an earlier test: {cluster.strays()}"
    yield
    left = cluster.wait_for_no_strays(within=15.0)
    kill_all(list(left))
    assert not left, f"processes left in the cluster's namespaces: {left}"


# --- running elasticrun in the launcher namespace ------------------------------------------


def train_env(cluster: Cluster, home: Path | None = None, samples: int = 64, epochs: int = 3,
              sleep: float = 0.0, faults: str = "", progress: Path | None = None,
              await_size: int = 0) -> dict[str, str]:
    env = {"HOME": str(home or cluster.home), "TRAIN_SAMPLES": str(samples),
           "TRAIN_EPOCHS": str(epochs), "TRAIN_BATCH": "4", "TRAIN_STEP_SLEEP": str(sleep),
           "FAULTS": faults, "TRAIN_AWAIT_SIZE": str(await_size)}
    if progress is not None:
        env["PROGRESS_FILE"] = str(progress)
    return env


def start_job(cluster: Cluster, args: Sequence[str], extra_env: dict[str, str],
              log_dir: Path, cwd: Path | None = None) -> tuple[subprocess.Popen[str], str]:
    """`elasticrun ARGS` in the launcher namespace, with the harness's tag in its env."""
    log_dir.mkdir(parents=True, exist_ok=True)
    env, tag = job_env({**extra_env, "LOG_DIR": str(log_dir)})
    proc = subprocess.Popen(
        cluster.elasticrun(args), env=env, cwd=cwd or log_dir, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, tag


def finish_job(proc: subprocess.Popen[str], tag: str, log_dir: Path, started: float,
               timeout: float) -> JobResult:
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        kill_all(tagged_pids(tag))
        raise AssertionError(f"elasticrun did not finish in {timeout}s:\n{stdout[-3000:]}\n"
                             f"{stderr[-5000:]}") from None
    result = JobResult(proc.returncode, stdout, stderr, time.monotonic() - started, time.time(),
                       tag, log_dir)
    result.records = list(read_records(log_dir))
    return result


def run_job(cluster: Cluster, args: Sequence[str], extra_env: dict[str, str], log_dir: Path,
            timeout: float = 150.0) -> JobResult:
    started = time.monotonic()
    proc, tag = start_job(cluster, args, extra_env, log_dir)
    result = finish_job(proc, tag, log_dir, started, timeout)
    assert_no_orphans(tag, within=10.0)
    return result


def wait_for_step(progress: Path, step: int, proc: subprocess.Popen[str],
                  within: float = 90.0) -> int:
    """Waits until rank 0 has committed `step`; returns the step it reached."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"job ended early ({proc.returncode}):\n"
                                 f"{proc.stderr.read() if proc.stderr else ''}")
        try:
            reached = int(json.loads(progress.read_text())[0])
        except (OSError, ValueError):
            reached = 0
        if reached >= step:
            return reached
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"training did not reach step {step} in {within}s")


def assert_ok(result: JobResult) -> None:
    assert result.returncode == 0, \
        f"job failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"


def workers_on(tag: str, host: str, log_dir: Path) -> list[int]:
    """The live workers on `host`, by the records they wrote (a worker forked by its host's
    template shows the template's environment in /proc, not its own)."""
    logged = {r["pid"] for r in read_records(log_dir) if r.get("host") == host}
    return [pid for pid in tagged_pids(tag) if pid in logged and not is_zombie(pid)]


# --- tests ---------------------------------------------------------------------------------


def test_job_spans_two_hosts(cluster: Cluster, tmp_path: Path) -> None:
    result = run_job(cluster, ["-H", f"{H1}:2,{H2}:2", "--min-np", "2", *COMMON, *TRAIN],
                     train_env(cluster), tmp_path / "logs")
    assert_ok(result)
    views = check_job(result.records, samples=64, epochs=3)
    assert [v.size for v in views] == [4]
    assert views[0].hosts_by_rank == {0: H1, 1: H1, 2: H2, 3: H2}
    worker_lines = [line for line in result.stdout.splitlines() if WORKER_LINE.match(line)]
    assert sorted(worker_lines) == [f"[{r}]<stdout>:finished rank {r} of 4 at step 12"
                                    for r in range(4)], result.stdout
    assert {r["host"] for r in result.events("start")} == {H1, H2}


@pytest.mark.parametrize("how", ["fault", "workers", "host-tree"])
def test_host_dies(cluster: Cluster, tmp_path: Path, how: str) -> None:
    """A worker of H2 SIGKILLs itself; or both workers of H2 are SIGKILLed from outside;
    or everything sshd forked on H2 (sessions, bootstraps, workers) is SIGKILLed."""
    progress = tmp_path / "progress"
    args = ["-H", f"{H1}:2,{H2}:2", "--min-np", "2", *COMMON, *TRAIN]
    if how == "fault":
        env = train_env(cluster, faults="5:2:sigkill")
        result = run_job(cluster, args, env, tmp_path / "logs")
    else:
        env = train_env(cluster, sleep=0.15, progress=progress)
        started = time.monotonic()
        proc, tag = start_job(cluster, args, env, tmp_path / "logs")
        try:
            wait_for_step(progress, 4, proc)
            victims = workers_on(tag, H2, tmp_path / "logs")
            assert len(victims) == 2, victims
            # They really run in H2's namespace, not in the launcher's.
            h2_net = netns_inode(cluster.host(H2).ns)
            assert all(os.stat(f"/proc/{pid}/ns/net").st_ino == h2_net for pid in victims)
            kill_all(victims if how == "workers" else cluster.host(H2).sshd_tree())
            result = finish_job(proc, tag, tmp_path / "logs", started, 150.0)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert_no_orphans(tag, within=10.0)
    assert_ok(result)
    views = check_job(result.records, samples=64, epochs=3)
    if how == "host-tree":  # its SSH connections went: the host is failed, and left out
        assert [v.size for v in views] == [4, 2]
        assert set(views[1].hosts_by_rank.values()) == {H1}
        assert f"host {H2} failed" in result.stderr, result.stderr
    else:  # its workers died: their slots get new workers (on H2 over SSH), that join
        assert views[0].size == 4 and views[1].size in (2, 3), views
        assert re.search(rf"slot {re.escape(H2)}\[\d\] gets a new worker", result.stderr)
        assert f"host {H2} failed" not in result.stderr, result.stderr


def test_link_cut(cluster: Cluster, tmp_path: Path) -> None:
    """H2's link goes down mid-training: its workers stop answering and its host cannot
    be asked (hang detection, well before the default 60 s collective timeout); the job
    ends on H1."""
    progress = tmp_path / "progress"
    h2 = cluster.host(H2)
    args = ["-H", f"{H1}:2,{H2}:2", "--min-np", "2", "--start-timeout", "15",
            "--discovery-interval", "0.2", *TRAIN]
    started = time.monotonic()
    proc, tag = start_job(cluster, args, train_env(cluster, sleep=0.15, progress=progress),
                          tmp_path / "logs")
    try:
        wait_for_step(progress, 4, proc)
        cluster.set_link(h2, up=False)
        cut_at = time.time()
        result = finish_job(proc, tag, tmp_path / "logs", started, 90.0)
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.set_link(h2, up=True)
    assert_ok(result)
    views = check_job(result.records, samples=64, epochs=3)
    assert [v.size for v in views] == [4, 2]
    assert set(views[-1].hosts_by_rank.values()) == {H1}
    assert re.search(rf"on host {H2} hung: no heartbeat for [\d.]+s, and its host does not "
                     r"answer", result.stderr), result.stderr[-3000:]
    resumed = min(r["time"] for r in result.records
                  if r["event"] == "step" and r["round"] == views[-1].number)
    assert resumed - cut_at < 15.0  # loose; the benchmark holds the target
    # H2's workers were cut off from the driver; they must still go away on their own.
    assert_no_orphans(tag, within=30.0)


def test_a_stopped_worker_on_an_ssh_host_is_found(cluster: Cluster, tmp_path: Path) -> None:
    """A worker of H2 stops itself (SIGSTOP): H2's sshd answers the driver's probe with its
    state, and the worker is killed on H2."""
    args = ["-H", f"{H1}:1,{H2}:1", "--min-np", "1", *COMMON, *TRAIN]
    result = run_job(cluster, args, train_env(cluster, faults="5:1:sigstop"),
                     tmp_path / "logs")
    assert_ok(result)
    views = check_job(result.records, samples=64, epochs=3)
    assert [v.size for v in views][:2] == [2, 1]  # then its slot's new worker may join
    assert f"rank 1 on host {H2} hung: its process is stopped (SIGSTOP)" in result.stderr, \
        result.stderr
    fault = next(r["time"] for r in result.records if r["event"] == "fault")
    resumed = min(r["time"] for r in result.records
                  if r["event"] == "step" and r["round"] == views[1].number)
    assert resumed - fault < 15.0


def test_host_joins_through_discovery(cluster: Cluster, tmp_path: Path) -> None:
    progress = tmp_path / "progress"
    script = tmp_path / "hosts.py"
    script.write_text(f"""#!{PYTHON}
import json
try:
    step = json.load(open({str(progress)!r}))[0]
except (OSError, ValueError):
    step = 0
print("{H1}:2")
if step >= 3:
    print("{H3}:2")
""")
    script.chmod(0o755)
    result = run_job(cluster, ["-np", "2", "--host-discovery-script", str(script), *COMMON,
                               *TRAIN],
                     train_env(cluster, epochs=4, progress=progress, await_size=4),
                     tmp_path / "logs")
    assert_ok(result)
    views = check_job(result.records, samples=64, epochs=4)
    assert [v.size for v in views] == [2, 4], result.stderr[-6000:]
    assert views[-1].hosts_by_rank == {0: H1, 1: H1, 2: H3, 3: H3}
    # The H1 workers kept their processes across the scale-up.
    assert set(views[0].ranks_by_pid) <= set(views[1].ranks_by_pid)


def test_ctrl_c_leaves_nothing(cluster: Cluster, tmp_path: Path) -> None:
    progress = tmp_path / "progress"
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    proc, tag = start_job(cluster, ["-H", f"{H1}:2,{H2}:2", "--min-np", "2", *COMMON, *TRAIN],
                          train_env(cluster, sleep=0.3, epochs=20, progress=progress),
                          tmp_path / "logs", cwd=job_dir)
    try:
        wait_for_step(progress, 3, proc)
        logs = tmp_path / "logs"
        assert len(workers_on(tag, H1, logs)) == 2 and len(workers_on(tag, H2, logs)) == 2
        os.kill(proc.pid, signal.SIGINT)  # `ip netns exec` execs python: same pid
        _, stderr = proc.communicate(timeout=30.0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode in (130, -signal.SIGINT), (proc.returncode, stderr)
    assert_no_orphans(tag, within=10.0)
    left = cluster.wait_for_no_strays(within=10.0)
    assert not left, f"left in the namespaces after Ctrl-C: {left}"
    with_cwd = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "cwd")).is_relative_to(job_dir):
                    with_cwd.append(entry.name)
            except OSError:
                continue
    assert not with_cwd, f"processes still in the job's directory: {with_cwd}"


def test_unusable_hosts_are_skipped(cluster: Cluster, tmp_path: Path) -> None:
    """Three of five hosts cannot be used, each its own way (its sshd stopped, a host key
    that is not the one known, packets to it dropped): one clear line about each, and the
    job runs on the other two. One job for the three: each fails on its own connection."""
    unusable = {H3: "connection refused", H4: "HOST KEY FOR 10.77.0.14 HAS CHANGED",
                H5: "timed out"}
    cluster.stop_sshd(cluster.host(H3))
    home = cluster.make_home(tmp_path / "home", {H4: keygen(tmp_path / "other_key")})
    cluster.black_hole(cluster.host(H5), True)  # every connect attempt times out
    try:
        # the start timeout bounds every connect attempt together (the last flag counts)
        hosts = ",".join(f"{h}:1" for h in (H1, H2, *unusable))
        result = run_job(cluster, ["-H", hosts, "--min-np", "2", *COMMON,
                                   "--start-timeout", "10", *TRAIN],
                         train_env(cluster, home=home), tmp_path / "logs")
    finally:
        cluster.start_sshd(cluster.host(H3))
        cluster.black_hole(cluster.host(H5), False)
    assert_ok(result)
    views = check_job(result.records, samples=64, epochs=3)
    assert views[-1].size == 2
    assert set(views[-1].hosts_by_rank.values()) == {H1, H2}
    for host, reason in unusable.items():
        # One line says what is wrong with the host, no traceback; it is tried again after
        # each cooldown (the lines in between say so), and each failure says it again.
        failed = [line for line in result.stderr.splitlines()
                  if f"host {host} failed" in line]
        assert failed and all(reason.lower() in line.lower() for line in failed), \
            (host, result.stderr)
    assert "Traceback" not in result.stderr
