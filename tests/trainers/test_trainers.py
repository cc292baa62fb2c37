"""Users' own trainers, unmodified, under both command forms: a Hugging Face Trainer and a
Lightning Trainer script (torchrun-style: they never call er.init()), each with one worker
SIGKILLed and, after it resumed, one SIGSTOPped mid-training. Each time every worker
restarts from the trainer's own checkpoint; the job ends rc 0, nothing left running."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.harness import PYTHON, assert_no_orphans, cmdline, start_job, tagged_pids

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TEMPLATE = "elasticrun.worker.template"

pytest.importorskip("transformers", reason="the trainers extra (pip install '.[trainers]')")
pytest.importorskip("lightning", reason="the trainers extra (pip install '.[trainers]')")


@dataclass
class Job:
    proc: subprocess.Popen[str]
    tag: str
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)

    def wait_for(self, pattern: str, timeout: float = 120.0) -> None:
        regex, deadline = re.compile(pattern), time.monotonic() + timeout
        while not any(regex.search(line) for line in list(self.out)):
            assert self.proc.poll() is None, f"ended before {pattern!r}:\n" \
                                             f"{''.join(self.err)[-3000:]}"
            assert time.monotonic() < deadline, f"no {pattern!r} in {timeout}s"
            time.sleep(0.05)

    def signal_a_worker(self, sig: signal.Signals) -> None:
        """A worker forked by the job's template (its parent is the template)."""
        for pid in tagged_pids(self.tag):
            try:
                parent = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2]
                             .split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if TEMPLATE in cmdline(parent) and TEMPLATE in cmdline(pid):
                os.kill(pid, sig)
                return
        raise AssertionError("no worker to signal")


def run(launch: list[str], script: str, out: Path) -> Job:
    args = ["--steps", "30", "--save-every", "10", "--out", str(out), "--step-sleep", "0.1"]
    proc, tag = start_job([*launch, *([PYTHON] if launch[0] == "-np" else []),
                           str(SCRIPTS / script), *args])
    job = Job(proc, tag)
    for stream, sink in ((proc.stdout, job.out), (proc.stderr, job.err)):
        threading.Thread(target=lambda s=stream, k=sink: k.extend(iter(s.readline, "")),
                         daemon=True).start()
    return job


@pytest.mark.parametrize("script", ["hf_trainer.py", "lightning_train.py"])
@pytest.mark.parametrize("launch", [
    ["-np", "2", "--max-restarts", "2"],
    ["--standalone", "--nproc-per-node", "2", "--max-restarts", "2"],
], ids=["np-form", "torchrun-form"])
def test_a_trainer_resumes_from_its_own_checkpoint_after_a_kill_and_a_stop(
        tmp_path: Path, launch: list[str], script: str) -> None:
    job = run(launch, script, tmp_path / "out")
    try:
        job.wait_for(r"step 12 rank 0 restart 0")
        job.signal_a_worker(signal.SIGKILL)
        job.wait_for(r"start resumed_from=10 world=2")
        job.wait_for(r"step 22 rank 0 restart 1")
        job.signal_a_worker(signal.SIGSTOP)
        job.wait_for(r"start resumed_from=20 world=2")
        code = job.proc.wait(120)
    finally:
        if job.proc.poll() is None:
            job.proc.kill()
    time.sleep(0.2)
    assert_no_orphans(job.tag)
    err = "".join(job.err)
    assert code == 0, err[-3000:]
    assert "was killed by SIGKILL; restarting every worker (restart 1 of --max-restarts 2)" \
        in err
    assert "hung: its process is stopped (SIGSTOP); restarting every worker (restart 2 of " \
           "--max-restarts 2)" in err
    out = "".join(job.out)
    assert "step 11 rank 0 restart 1" in out and "step 21 rank 0 restart 2" in out
    assert "step 30 rank 1 restart 2" in out and "done steps=30 world=2" in out
