"""A job's output is the user's: no warning from torch or elasticrun reaches it. Each worker
builds its groups through torch calls that some releases deprecate (torch 2.14 warns at its
private `_set_pg_timeout`, a FutureWarning every worker printed at its first group), so
these jobs run under each torch the suite runs on (.ci/run). OMP_NUM_THREADS is set, as its
advice says: elasticrun's one deliberate warning to a job of this shape is not the subject."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.harness import PYTHON, SCRIPTS, run_job

pytestmark = pytest.mark.timeout(180)

QUIET = {"OMP_NUM_THREADS": "1"}


def warnings_in(output: str) -> list[str]:
    return [line for line in output.splitlines() if "warning" in line.lower()]


def test_a_fixed_size_job_prints_no_warning() -> None:
    """Default groups built twice per worker (init, shutdown, init), a process set rank 0
    is not in, DistributedOptimizer's reductions."""
    result = run_job(["-np", "2", "--start-timeout", "60", PYTHON,
                      str(SCRIPTS / "group_builds.py")], extra_env=QUIET, timeout=150)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "[0]<stdout>:groups ok 0" in result.stdout, output[-4000:]
    assert "[1]<stdout>:groups ok 1" in result.stdout, output[-4000:]
    assert warnings_in(output) == [], output[-4000:]


def test_an_elastic_job_prints_no_warning(tmp_path: Path) -> None:
    """An elastic job's state: its sync, its commits, its epoch's end."""
    result = run_job(["-np", "2", "--min-np", "1", "--start-timeout", "60", PYTHON,
                      str(SCRIPTS / "elastic_train.py")],
                     extra_env={**QUIET, "TRAIN_EPOCHS": "1"}, timeout=150, log_dir=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert len(result.events("final")) == 2, output[-4000:]
    assert warnings_in(output) == [], output[-4000:]
