"""elasticrun inside a real Slurm job (tests/slurm/cluster.py: three nodes, each in its own
network namespace): `sbatch -N3` runs `elasticrun --launcher slurm`, which starts a worker
on each node with srun and finds the nodes through `--discovery slurm`.

It trains; one node's worker is SIGKILLed and the survivors recover in-process; a node
drained with `scontrol update ... state=drain` leaves at a commit, without a rollback; the
job completes, and no process is left in any node.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tests.integration.harness import PYTHON, REPO, SCRIPTS, job_env, read_records, tagged_pids
from tests.integration.progress import check_job
from tests.slurm.cluster import SlurmCluster
from tests.ssh.netns import cmdline

JOB_TIMEOUT_S = 150.0


def progress(path: Path) -> tuple[int, int]:
    try:
        step, size = json.loads(path.read_text())
        return int(step), int(size)
    except (OSError, ValueError):
        return 0, 0


def wait_for(what: str, check: object, slurm: SlurmCluster, job: str, output: Path,
             timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if job not in " ".join(slurm.queue()):
            raise AssertionError(f"the Slurm job ended while waiting for {what}:\n"
                                 f"{output.read_text(errors='replace')[-4000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n"
                                 f"{output.read_text(errors='replace')[-4000:]}")
        time.sleep(0.1)


def worker_on(tag: str, node: str) -> int:
    """The worker process itself, on `node` (not the srun that carries it, on n1)."""
    for pid in tagged_pids(tag):
        if Path(cmdline(pid).split(" ")[0]).name == "srun":
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"ELASTICRUN_HOSTNAME={node}".encode() in environ and \
                f"SLURMD_NODENAME={node}".encode() in environ:
            return pid
    raise AssertionError(f"no worker on node {node}")


def job_state(slurm: SlurmCluster, job: str) -> dict[str, str]:
    out = slurm.run(["scontrol", "show", "job", job]).stdout
    return dict(item.split("=", 1) for item in out.split() if "=" in item)


def test_sbatch_job_recovers_in_process_and_drains_a_node(slurm: SlurmCluster,
                                                          tmp_path: Path) -> None:
    logs, progress_file, output = tmp_path / "logs", tmp_path / "progress", tmp_path / "out"
    logs.mkdir()
    # (steps are slower at 2 workers: a new step for the killed one's slot, slow to start on
    # a loaded machine, joins before the job's last epoch)
    env, tag = job_env({"TRAIN_EPOCHS": "16", "TRAIN_SAMPLES": "48", "TRAIN_BATCH": "4",
                        "TRAIN_STEP_SLEEP": "0.08", "TRAIN_SLOW_BELOW": "3",
                        "LOG_DIR": str(logs), "PROGRESS_FILE": str(progress_file)})
    script = tmp_path / "job.sh"
    script.write_text(
        f"#!/bin/sh\nexec {PYTHON} -m elasticrun --launcher slurm --min-np 1 "
        # Slurm cannot say what a step's process does: a new step, still busy starting
        # on a loaded machine, is not to be taken for a hung one
        f"--hang-timeout 30 "
        f"--network-interface eth0 --discovery-interval 0.3 --start-timeout 60 "
        f"{PYTHON} {SCRIPTS / 'elastic_train.py'}\n")
    script.chmod(0o755)
    submitted = slurm.run(["sbatch", "--parsable", "-N3", "--ntasks-per-node=1",
                           f"--output={output}", f"--chdir={REPO}", str(script)], env=env)
    job = submitted.stdout.strip().split(";")[0]
    try:
        wait_for("3 workers", lambda: progress(progress_file) >= (3, 3), slurm, job, output)
        n1_worker = worker_on(tag, "n1")
        os.kill(worker_on(tag, "n3"), signal.SIGKILL)  # its slot gets a new step on n3
        wait_for("2 workers", lambda: progress(progress_file)[1] == 2, slurm, job, output)
        wait_for("3 workers again", lambda: progress(progress_file)[1] == 3, slurm, job,
                 output)
        drained_at = time.time()
        slurm.drain("n2")
        wait_for("2 workers", lambda: progress(progress_file)[1] == 2, slurm, job, output)
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while job in " ".join(slurm.queue()) and time.monotonic() < deadline:
            time.sleep(0.2)
        state = job_state(slurm, job)
        text = output.read_text(errors="replace")
        assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", \
            f"{state.get('JobState')} {state.get('ExitCode')}:\n{text[-4000:]}"
    finally:
        slurm.run(["scancel", job], check=False)
        slurm.resume("n2")
    records = list(read_records(logs))
    views = check_job(records, samples=48, epochs=16)
    assert [v.size for v in views] == [3, 2, 3, 2], text[-3000:]
    assert [set(v.hosts_by_rank.values()) for v in views] == [
        {"n1", "n2", "n3"}, {"n1", "n2"}, {"n1", "n2", "n3"}, {"n1", "n3"}]
    # n1's worker went through every round in its own process.
    assert all(n1_worker in v.ranks_by_pid for v in views)
    restores = [r for r in records if r["event"] == "restore"]
    assert restores and all(r["time"] < drained_at for r in restores), \
        "the drain rolled back: only the SIGKILL may"
    assert "slot n3[0] gets a new worker" in text and "hosts now: n1:1,n3:1" in text
    deadline = time.monotonic() + 15
    while (slurm.strays() or tagged_pids(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not slurm.strays(), f"left in the nodes: {slurm.strays()}"
    assert not tagged_pids(tag)
