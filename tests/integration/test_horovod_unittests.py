"""Horovod's own way of testing, run by elasticrun: a unittest module that inits in setUp
and shuts down in tearDown (scripts/horovod_unittest_style.py), and init -> shutdown ->
init cycles (scripts/reinit.py), on 2 real workers and on a worker started without the
launcher."""

from __future__ import annotations

import subprocess

import pytest

from tests.integration.harness import PYTHON, SCRIPTS, job_env, run_job


def test_a_horovod_style_unittest_module_passes_on_every_rank() -> None:
    result = run_job(["-np", "2", PYTHON, str(SCRIPTS / "horovod_unittest_style.py"), "-v"],
                     timeout=120)
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in (0, 1):
        assert f"[{rank}]<stderr>:Ran 8 tests" in result.stderr, result.stderr[-4000:]
        assert f"[{rank}]<stderr>:OK" in result.stderr


@pytest.mark.parametrize("sizes", [["-np", "2"], ["-np", "2", "--min-np", "1"]],
                         ids=["fixed", "elastic"])
def test_init_shutdown_init_cycles_under_the_launcher(sizes: list[str]) -> None:
    result = run_job([*sizes, PYTHON, str(SCRIPTS / "reinit.py")], timeout=120)
    assert result.returncode == 0, result.stderr[-4000:]
    rounds = [line for line in result.stdout.splitlines() if "cycle" in line]
    assert len(rounds) == 12, result.stdout  # 6 cycles on each of 2 ranks
    assert result.stdout.count("reinit ok") == 2
    # every cycle after a shutdown is a new round of the same 2 workers
    numbers = {int(line.rsplit(" ", 1)[1]) for line in rounds}
    assert len(numbers) == 6, rounds


def test_init_shutdown_init_cycles_without_the_launcher() -> None:
    env, _ = job_env()
    result = subprocess.run([PYTHON, str(SCRIPTS / "reinit.py")], env=env, timeout=120,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.count("rank 0 of 1") == 6 and "reinit ok" in result.stdout
