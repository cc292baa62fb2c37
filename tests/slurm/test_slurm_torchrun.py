"""torchrun's form inside a real Slurm job (tests/slurm/cluster.py: nodes in network
namespaces of their own). The batch script is what users write around torchrun, with
`elasticrun` in its place:

    srun elasticrun --nnodes 2 --nproc-per-node 1 --rdzv-endpoint $ADDR:$PORT \\
         --rdzv-id $SLURM_JOB_ID ddp_checkpoint.py ...

one task per node; the first node (the batch host, whose address the script reads) serves
the job's driver, the other's elasticrun is an agent that connects out to it; nodes are
named by $SLURMD_NODENAME. The job completes (COMPLETED 0:0); a worker SIGKILLed mid-job
restarts the round (--max-restarts 1) and the job still completes. Nothing is left on any
node.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.agents.test_torchrun_nodes import (
    DONE,
    RANKED_LINES,
    SAVE_EVERY,
    SCRIPT,
    ranks_in_round,
    report,
    rounds_of,
    workers_in,
)
from tests.integration.harness import PYTHON, REPO, job_env, tagged_pids
from tests.slurm.cluster import SlurmCluster
from tests.slurm.test_slurm_jobs import job_state, wait_for
from tests.ssh.netns import cmdline

pytestmark = pytest.mark.timeout(180)

JOB_END_S = 60.0


def elasticrun() -> str:
    """The `elasticrun` command beside this interpreter (the venv's console script)."""
    script = Path(PYTHON).parent / "elasticrun"
    return str(script) if script.exists() else f"{PYTHON} -m elasticrun"


def batch_script(tmp: Path, steps: int, step_sleep: float, extra: str = "") -> Path:
    """torchrun's usual Slurm wrapper: the head node's address and a port from the job's
    id, then the same line on every node through srun. No GLOO_SOCKET_IFNAME, which torchrun
    would need here (the nodes' host name resolves to loopback): each worker's foothold gives
    Gloo the interface that reaches the driver. The rendezvous id is the job's id and the
    test's: clusters of tests run at once share one /tmp, where each launcher holds its place
    on its node (cli/node_claim.py), and their job ids and addresses are alike."""
    script = tmp / "job.sh"
    script.write_text(
        "#!/bin/sh\n"
        "ADDR=$(ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1)\n"
        "PORT=$((20000 + SLURM_JOB_ID % 10000))\n"
        f"srun {elasticrun()} --nnodes 2 --nproc-per-node 1 --rdzv-endpoint $ADDR:$PORT "
        f"--rdzv-id {tmp.parent.name}-{tmp.name}-$SLURM_JOB_ID --tee 1 "
        f"--log-dir {tmp / 'logs'} "
        f"--prefix-output-with-timestamp {extra} "
        f"{SCRIPT} --steps {steps} --save-every {SAVE_EVERY} --out {tmp / 'checkpoints'} "
        f"--step-sleep {step_sleep}\n")
    script.chmod(0o755)
    return script


def submit(slurm: SlurmCluster, tmp: Path, script: Path) -> tuple[str, str, Path]:
    """sbatch -N2: the job's id, its test tag, its output file."""
    env, tag = job_env(RANKED_LINES)
    output = tmp / "out"
    submitted = slurm.run(["sbatch", "--parsable", "-N2", "--ntasks-per-node=1",
                           f"--output={output}", f"--chdir={REPO}", str(script)], env=env)
    return submitted.stdout.strip().split(";")[0], tag, output


def wait_for_end(slurm: SlurmCluster, job: str, output: Path) -> str:
    """Waits for the job to leave the queue; asserts COMPLETED 0:0; returns its output."""
    deadline = time.monotonic() + JOB_END_S
    while job in " ".join(slurm.queue()) and time.monotonic() < deadline:
        time.sleep(0.2)
    state, text = job_state(slurm, job), output.read_text(errors="replace")
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", \
        f"{state.get('JobState')} {state.get('ExitCode')}:\n{text[-5000:]}"
    return text


def assert_nothing_left(slurm: SlurmCluster, tag: str) -> None:
    deadline = time.monotonic() + 15
    while (slurm.strays() or tagged_pids(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not slurm.strays(), f"left in the nodes: {slurm.strays()}"
    assert not tagged_pids(tag), [cmdline(p) for p in tagged_pids(tag)]


def test_srun_elasticrun_in_torchruns_form_completes(slurm: SlurmCluster,
                                                     tmp_path: Path) -> None:
    began = time.monotonic()
    job, tag, output = submit(slurm, tmp_path, batch_script(tmp_path, steps=20,
                                                            step_sleep=0.05))
    try:
        text = wait_for_end(slurm, job, output)
    finally:
        slurm.run(["scancel", job], check=False)
    assert [m.groups() for m in DONE.finditer(text)] == [("20", "2")], text[-5000:]
    [only] = rounds_of(text)
    assert (only.resumed_from, only.world) == (0, 2)
    assert {s.rank for s in only.steps} == {0, 1} and {s.restart for s in only.steps} == {0}
    assert "agent joined: host n1" in text and "agent joined: host n2" in text
    assert "elasticrun: error" not in text
    assert_nothing_left(slurm, tag)
    report("slurm job", total=time.monotonic() - began)


def test_a_killed_worker_restarts_and_the_slurm_job_completes(slurm: SlurmCluster,
                                                              tmp_path: Path) -> None:
    began = time.monotonic()
    script = batch_script(tmp_path, steps=40, step_sleep=0.1, extra="--max-restarts 1")
    job, tag, output = submit(slurm, tmp_path, script)
    n2 = next(n for n in slurm.nodes if n.name == "n2")
    read = lambda: output.read_text(errors="replace") if output.exists() else ""  # noqa: E731
    try:
        wait_for("a checkpoint", lambda: (r := rounds_of(read())) and r[0].reached(
            SAVE_EVERY + 1), slurm, job, output, timeout=90)
        victims = workers_in(n2.ns, tag)
        assert len(victims) == 1, f"workers on n2: {victims}:\n{read()[-3000:]}"
        [victim] = victims
        os.kill(victim, signal.SIGKILL)
        killed = time.time()
        text = wait_for_end(slurm, job, output)
    finally:
        slurm.run(["scancel", job], check=False)
    rounds = rounds_of(text)
    assert [(r.world, {s.restart for s in r.steps}) for r in rounds] == [
        (2, {0}), (2, {1})], text[-5000:]
    assert rounds[1].resumed_from >= SAVE_EVERY
    first = ranks_in_round(text, 1)
    assert set(first) == {"n1", "n2"} and ranks_in_round(text, 2) == first  # the same nodes
    assert "restart 1 of --max-restarts 1" in text
    assert [m.groups() for m in DONE.finditer(text)] == [("40", "2")]
    assert_nothing_left(slurm, tag)
    report("slurm worker killed", kill_to_first_step=rounds[1].first_step_at - killed,
           total=time.monotonic() - began)
