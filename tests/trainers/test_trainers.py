"""Users' own trainers, unmodified, under both command forms: a Hugging Face Trainer and a
Lightning Trainer script (torchrun-style: they never call er.init()), each with one worker
SIGKILLed and, after it resumed, one SIGSTOPped mid-training. Each time every worker
restarts from the trainer's own checkpoint; the job ends rc 0, nothing left running."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.integration.harness import PYTHON
from tests.integration.watched import Watched, watch

SCRIPTS = Path(__file__).resolve().parent / "scripts"

pytest.importorskip("transformers", reason="the trainers extra (pip install '.[trainers]')")
pytest.importorskip("lightning", reason="the trainers extra (pip install '.[trainers]')")


def run(launch: list[str], script: str, out: Path) -> Watched:
    args = ["--steps", "30", "--save-every", "10", "--out", str(out), "--step-sleep", "0.1"]
    return watch([*launch, *([PYTHON] if launch[0] == "-np" else []),
                  str(SCRIPTS / script), *args])


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
    finally:
        code = job.finish()
    err = job.stderr
    assert code == 0, err[-3000:]
    assert "was killed by SIGKILL; restarting every worker (restart 1 of --max-restarts 2)" \
        in err
    assert "hung: its process is stopped (SIGSTOP); restarting every worker (restart 2 of " \
           "--max-restarts 2)" in err
    out = job.out
    assert "step 11 rank 0 restart 1" in out and "step 21 rank 0 restart 2" in out
    assert "step 30 rank 1 restart 2" in out and "done steps=30 world=2" in out
