"""A Slurm job outlives its driver (tests/slurm/cluster.py: three nodes, each in its own
network namespace). The batch script starts an `elasticrun agent` per node as one srun
step, and runs the driver (`--launcher agent --discovery slurm --state-dir DIR`) in a loop
that restarts it with --resume when a signal killed it (README's loop, except that it waits
for the test's word before the restart, instead of a second: the workers are seen training
without a driver however slow the machine is).

The driver is SIGKILLed while training; the workers train on, the loop brings it back, it
re-adopts every worker (the same processes, no rollback), and the job completes with
nothing left in any node.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.agents.harness import train_env
from tests.integration.harness import (
    PYTHON,
    REPO,
    SCRIPTS,
    cmdline,
    is_zombie,
    job_env,
    read_records,
    tagged_pids,
)
from tests.integration.progress import check_job, read_progress
from tests.slurm.cluster import SlurmCluster
from tests.slurm.test_slurm_jobs import job_state, wait_for

TOKEN = "slurm-driver-restart-token-0123456789"
PORT = 29478  # in the first node's own network namespace


def batch_script(tmp: Path) -> Path:
    token, state = tmp / "token", tmp / "state"
    token.write_text(TOKEN)
    driver = (f"{PYTHON} -m elasticrun --launcher agent --discovery slurm --port {PORT} "
              f"--agent-token-file {token} --min-np 1 --network-interface eth0 "
              f"--discovery-interval 0.3 --start-timeout 60 --state-dir {state} "
              f"$([ -e {state}/journal.json ] && echo --resume) "
              f"{PYTHON} {SCRIPTS / 'elastic_train.py'}")
    script = tmp / "job.sh"
    script.write_text(
        "#!/bin/sh\n"
        "ADDR=$(ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1)\n"
        f"srun --overlap --ntasks-per-node=1 sh -c 'exec {PYTHON} -m elasticrun agent "
        f"--driver http://'$ADDR':{PORT} --token-file {token} --host $SLURMD_NODENAME' &\n"
        "restarts=0\n"
        "while :; do\n"
        f"  {driver}\n"
        "  code=$?\n"
        "  [ $code -gt 128 ] && [ $restarts -lt 3 ] || break\n"
        "  restarts=$((restarts + 1))\n"
        "  echo \"driver killed (exit $code): restart $restarts with --resume\" >&2\n"
        f"  while [ ! -e {tmp / 'restart'} ]; do sleep 0.1; done; rm {tmp / 'restart'}\n"
        "done\n"
        "wait\n"
        "exit $code\n")
    script.chmod(0o755)
    return script


def drivers(tag: str) -> list[int]:
    found = [pid for pid in tagged_pids(tag) if not is_zombie(pid)
             and " -m elasticrun --launcher agent " in cmdline(pid)]
    # not a child the driver forked, for the moment before its exec (its command line is
    # the driver's then: a suite run found two drivers so)
    return [pid for pid in found if _parent(pid) not in found]


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def test_a_killed_driver_is_restarted_by_the_batch_script_and_keeps_its_workers(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    logs, progress, output, stop = (tmp_path / n for n in ("logs", "progress", "out", "stop"))
    env, tag = job_env(train_env(logs, progress, epochs=1000, sleep=0.05, samples=24,
                                 stop_file=stop))
    job = slurm.run(["sbatch", "--parsable", "-N3", "--ntasks-per-node=1",
                     f"--output={output}", f"--chdir={REPO}", str(batch_script(tmp_path))],
                    env=env).stdout.strip().split(";")[0]
    try:
        wait_for("3 workers", lambda: read_progress(progress) >= (3, 3), slurm, job, output)
        pids = sorted({r["pid"] for r in read_records(logs) if r["event"] == "round"})
        [driver] = drivers(tag)
        os.kill(driver, signal.SIGKILL)
        lost_at = read_progress(progress)[0]
        # The loop restarts the driver once the test says so: the workers train on.
        wait_for("training without a driver", lambda: read_progress(progress)[0] >= lost_at + 3,
                 slurm, job, output, timeout=30)
        (tmp_path / "restart").touch()
        wait_for("a new driver", lambda: [p for p in drivers(tag) if p != driver],
                 slurm, job, output, timeout=15)
        wait_for("the re-adoption", lambda: "re-adopted" in output.read_text(errors="replace"),
                 slurm, job, output, timeout=30)
        resumed_at = read_progress(progress)[0]
        wait_for("training under it", lambda: read_progress(progress)[0] >= resumed_at + 3,
                 slurm, job, output, timeout=30)
        stop.touch()
        deadline = time.monotonic() + 30
        while job in " ".join(slurm.queue()) and time.monotonic() < deadline:
            time.sleep(0.2)
        state, text = job_state(slurm, job), output.read_text(errors="replace")
        assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", \
            f"{state.get('JobState')} {state.get('ExitCode')}:\n{text[-4000:]}"
    finally:
        slurm.run(["scancel", job], check=False)
    assert "driver killed (exit 137): restart 1 with --resume" in text, text[-3000:]
    assert "driver restarted (epoch 2): re-adopted 3 of 3 worker(s)" in text, text[-3000:]
    records = list(read_records(logs))
    views = check_job(records, samples=24, epochs=None)
    assert [v.size for v in views] == [3], text[-3000:]
    assert sorted(views[0].ranks_by_pid) == pids  # the same processes, in one round
    assert set(views[0].hosts_by_rank.values()) == {"n1", "n2", "n3"}
    assert not [r for r in records if r["event"] == "restore"], "a rollback"
    assert job not in " ".join(slurm.queue())
    deadline = time.monotonic() + 15
    while (slurm.strays() or tagged_pids(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not slurm.strays(), f"left in the nodes: {slurm.strays()}"
    assert not tagged_pids(tag), [cmdline(p) for p in tagged_pids(tag)]
