"""However a job ends, the launcher exits and its output closes within a few seconds, and
nothing it started is left: success (with hosts replaced at every epoch and discovery
polled all the time, where a lost cancellation once kept the launcher running after the
job), failure, reset limit, elastic timeout, SIGINT and SIGTERM. The output is read through
pipes, as a caller reads it."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.integration import horovod_style
from tests.integration.job_end import JobEnd, run_and_time_end

LATE_S = 5.0
ONE_SLOT_HOSTS = ["localhost", "127.0.0.1", "127.0.0.2", "127.0.0.3"]


def assert_ended_on_time(end: JobEnd, code: int) -> None:
    tail = "\n".join(end.output[-15:])
    assert end.ended is not None, f"the job never ended:\n{tail}"
    assert end.code == code, tail
    assert end.lateness <= LATE_S, (
        f"the launcher exited {end.after_end(end.exited)} s and its output closed "
        f"{end.after_end(end.eof)} s after the job ended:\n{tail}")
    assert not end.left, f"processes outlived the job: {end.left}"


def scenario(tmp_path: Path, schedule: horovod_style.Schedule, **options: object) -> list[str]:
    args, _ = horovod_style.command(tmp_path, schedule, **options)  # type: ignore[arg-type]
    return args


def test_success_with_hosts_replaced_every_epoch(tmp_path: Path) -> None:
    hosts = ONE_SLOT_HOSTS
    schedule: horovod_style.Schedule = [(0, hosts[0:2]), (1, hosts[1:3]), (None, hosts[2:4])]
    end = run_and_time_end(scenario(tmp_path, schedule, flags=["--discovery-interval", "0.01"],
                                    script_args=["--discovery-wait", "20"]))
    assert_ended_on_time(end, 0)
    assert any("all 2 worker(s) of round 3 finished" in line for line in end.output)


def test_failure(tmp_path: Path) -> None:
    schedule: horovod_style.Schedule = [(None, ["localhost:2"])]
    end = run_and_time_end(scenario(tmp_path, schedule, np=2, min_np=2, max_np=2,
                                    exit_schedule={"(1, 2)": [0, 1]}))
    assert_ended_on_time(end, 1)


def test_reset_limit(tmp_path: Path) -> None:
    schedule: horovod_style.Schedule = [(None, ["localhost:1", "127.0.0.1:1", "127.0.0.2:1"])]
    end = run_and_time_end(scenario(tmp_path, schedule, np=3, min_np=1, max_np=3,
                                    flags=["--reset-limit", "0"],
                                    exit_schedule={"(1, 2)": [2]}, exit_mode="kill"))
    assert_ended_on_time(end, 1)
    assert any("reset limit 0 reached" in line for line in end.output)


def test_elastic_timeout(tmp_path: Path) -> None:
    schedule: horovod_style.Schedule = [(0, ["localhost:1", "127.0.0.1:1"]), (None, [])]
    end = run_and_time_end(scenario(tmp_path, schedule, np=2, min_np=2, max_np=2,
                                    flags=["--elastic-timeout", "1"],
                                    script_args=["--discovery-wait", "20"]))
    assert_ended_on_time(end, 1)
    assert any("elastic timeout" in line for line in end.output)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted(tmp_path: Path, sig: signal.Signals, code: int) -> None:
    schedule: horovod_style.Schedule = [(None, ["localhost:2"])]
    end = run_and_time_end(scenario(tmp_path, schedule, np=2, min_np=2, max_np=2,
                                    script_args=["--epochs", "1000", "--epoch-wait", "0.2"]),
                           interrupt=sig)
    assert_ended_on_time(end, code)
