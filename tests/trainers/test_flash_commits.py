"""Flash commits on users' own trainers: a Hugging Face Trainer and a Lightning Trainer
script with elasticrun's ElasticCallback added (the one line), their disk checkpoints far
apart. A worker SIGKILLed at step 37 (or every worker at once): the restarted workers
resume within the flash cadence the workers report (every step or few, as a copy costs),
not at the last disk checkpoint; rc 0, nothing left.
The scripts import elasticrun but never call er.init(): they are restarted as torchrun
scripts are."""

from __future__ import annotations

import json
import os
import re
import signal
import urllib.request
from pathlib import Path

import pytest

from tests.integration.harness import PYTHON, cmdline, tagged_pids
from tests.integration.watched import TEMPLATE, Watched, watch

SCRIPTS = Path(__file__).resolve().parent / "scripts"
KILLED_AT = 37

pytest.importorskip("transformers", reason="the trainers extra (pip install '.[trainers]')")
pytest.importorskip("lightning", reason="the trainers extra (pip install '.[trainers]')")


def run(launch: list[str], script: str, out: Path, save_every: int, steps: int) -> Watched:
    args = ["--steps", str(steps), "--save-every", str(save_every), "--out", str(out),
            "--step-sleep", "0.15", "--flash"]
    return watch([*launch, *([PYTHON] if launch[0] == "-np" else []),
                  str(SCRIPTS / script), *args])


def kill_every_worker(job: Watched) -> None:
    killed = 0
    for pid in tagged_pids(job.tag):
        if TEMPLATE in cmdline(pid) and "--flash" in cmdline(pid):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    assert killed >= 2, "fewer than 2 workers to kill"


def resumed_from(job: Watched) -> int:
    """The step the restarted workers resumed from: one before their first step."""
    return int(job.wait_for(r"step (\d+) rank 0 restart 1").group(1)) - 1


def flash_cadence(job: Watched) -> int:
    """/status's flash_commits: the cadence the workers report, checked against the rule
    (every step while a commit costs under 2% of one, else as often as keeps it under)."""
    url = re.search(r"status at (http://\S+/status)", job.stderr)
    assert url is not None, job.stderr[-2000:]
    with urllib.request.urlopen(url.group(1), timeout=10) as reply:
        flash = json.load(reply)["flash_commits"]
    assert isinstance(flash, dict) and flash["workers"] == 2, flash
    every = flash["every_steps"]
    assert isinstance(every, int) and 1 <= every <= 10, flash  # (a copy: ~1% of a step)
    assert every == 1 or float(str(flash["cost"])) <= 0.03, flash
    return every


def check_the_end(job: Watched, steps: int, every: int) -> None:
    code = job.finish()
    assert code == 0, job.stderr[-3000:]
    assert "restarting every worker (restart 1 of --max-restarts 3)" in job.stderr
    assert f"done steps={steps} world=2" in job.out
    last_before = max(int(m) for m in re.findall(r"step (\d+) rank \d restart 0", job.out))
    first_after = min(int(m) for m in re.findall(r"step (\d+) rank \d restart 1", job.out))
    resumed = first_after - 1
    assert f"start resumed_from={resumed} world=2" in job.out
    assert last_before - resumed <= every + 1, (last_before, resumed, every)


@pytest.mark.parametrize("launch,kill_all", [
    (["-np", "2", "--max-restarts", "3"], False),
    (["--nproc-per-node=2", "--max-restarts=3"], True),
], ids=["np-form-one-worker", "torchrun-form-every-worker"])
def test_a_hugging_face_trainer_resumes_from_its_flash_commit(
        tmp_path: Path, launch: list[str], kill_all: bool) -> None:
    job = run(launch, "hf_trainer.py", tmp_path / "out", save_every=50, steps=45)
    try:
        job.wait_for(rf"step {KILLED_AT} rank 0 restart 0")
        every = flash_cadence(job)
        if kill_all:
            kill_every_worker(job)
        else:
            job.signal_a_worker(signal.SIGKILL)
        assert resumed_from(job) >= KILLED_AT - every - 1
    except BaseException:
        job.finish()
        raise
    check_the_end(job, 45, every)


def test_a_lightning_fit_resumes_mid_epoch_from_its_flash_commit(tmp_path: Path) -> None:
    job = run(["--standalone", "--nproc-per-node=2", "--max-restarts=3"],
              "lightning_train.py", tmp_path / "out", save_every=0, steps=45)
    try:
        job.wait_for(rf"step {KILLED_AT} rank 0 restart 0")  # epoch 3 of 16 steps each
        every = flash_cadence(job)
        job.signal_a_worker(signal.SIGKILL)
        assert resumed_from(job) >= KILLED_AT - every - 1
    except BaseException:
        job.finish()
        raise
    check_the_end(job, 45, every)


def test_a_plain_ddp_loop_resumes_from_its_flash_commit_to_the_same_weights(
        tmp_path: Path) -> None:
    """The weights at the end equal those of a run that was never interrupted: the flash
    commit is the state of its step, exactly."""
    launch = ["--standalone", "--nproc-per-node=2", "--max-restarts=3"]
    job = run(launch, "ddp_checkpoint.py", tmp_path / "out", save_every=50, steps=45)
    try:
        job.wait_for(rf"step {KILLED_AT} rank 0 restart 0")
        every = flash_cadence(job)
        job.signal_a_worker(signal.SIGKILL)
        assert resumed_from(job) >= KILLED_AT - every - 1
    except BaseException:
        job.finish()
        raise
    check_the_end(job, 45, every)
    quiet = watch([*launch, str(SCRIPTS / "ddp_checkpoint.py"), "--steps", "45",
                   "--save-every", "50", "--out", str(tmp_path / "quiet")])
    assert quiet.finish() == 0, quiet.stderr[-3000:]
    weights = re.compile(r"done steps=45 world=2 weights=(\S+)")
    interrupted, uninterrupted = weights.search(job.out), weights.search(quiet.out)
    assert interrupted is not None and uninterrupted is not None
    assert interrupted.group(1) == uninterrupted.group(1)
