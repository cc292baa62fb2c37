"""Local workers outlive a killed driver when the job keeps a journal (--state-dir): they
run under agents of the job's own, and a driver resumed with --resume takes them back, a
round that broke while it was away included. A clean stop (SIGTERM, the job's end) still
stops every one of them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.agents.harness import kill_job, train_env
from tests.integration.harness import (
    PYTHON,
    REPO,
    SCRIPTS,
    assert_no_orphans,
    is_zombie,
    job_env,
    read_records,
    tagged_pids,
)
from tests.integration.progress import check_job, read_progress

FOUR = ["-np", "4", "--min-np", "2", "-H", "localhost:2,127.0.0.1:2"]


class LocalJob:
    def __init__(self, tmp: Path, hosts: Sequence[str] = tuple(FOUR),
                 env: dict[str, str] | None = None) -> None:
        self.stop = tmp / "stop"
        self.logs = tmp / "logs"
        self.progress = tmp / "progress"
        self.env, self.tag = job_env({**train_env(self.logs, self.progress, epochs=100_000,
                                                  sleep=0.05, stop_file=self.stop),
                                      **(env or {})})
        self.state = tmp / "state"
        self.args = [*hosts, "--start-timeout", "60",
                     "--state-dir", str(self.state), PYTHON,
                     str(SCRIPTS / "elastic_train.py")]
        self.drivers: list[subprocess.Popen[str]] = []

    def driver(self, *extra: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([PYTHON, "-m", "elasticrun", *extra, *self.args], env=self.env,
                                cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        self.drivers.append(proc)
        return proc

    def short_resume(self) -> subprocess.Popen[str]:
        """`elasticrun --resume --state-dir DIR`, from elsewhere: the job's command line and
        directory come from DIR."""
        proc = subprocess.Popen([PYTHON, "-m", "elasticrun", "--resume", "--state-dir",
                                 str(self.state)], env=self.env, cwd="/",
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        self.drivers.append(proc)
        return proc

    def step(self) -> int:
        return read_progress(self.progress)[0]

    def wait_steps(self, after: int, steps: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.step() < after + steps:
            assert time.monotonic() < deadline, f"no {steps} steps after step {after}"
            time.sleep(0.05)

    def workers(self) -> list[int]:
        logged = {r["pid"] for r in read_records(self.logs)}
        return sorted(p for p in tagged_pids(self.tag) if p in logged and not is_zombie(p))

    def kill_all(self) -> None:
        kill_job(self.drivers, self.tag)
        for proc in self.drivers:
            proc.communicate()


@pytest.fixture
def job(tmp_path: Path) -> Iterator[LocalJob]:
    local = LocalJob(tmp_path)
    yield local
    local.kill_all()


def test_local_workers_outlive_a_killed_driver_and_are_taken_back(job: LocalJob) -> None:
    first = job.driver()
    job.wait_steps(0, 3)
    pids = job.workers()
    assert len(pids) == 4
    first.kill()  # SIGKILL: no chance to stop anyone
    first.communicate()
    job.wait_steps(job.step(), 5)  # the workers train on without a driver
    assert job.workers() == pids
    second = job.short_resume()  # `elasticrun --resume --state-dir DIR` alone
    job.wait_steps(job.step(), 5)
    job.stop.touch()
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err[-3000:]
    assert "driver restarted (epoch 2): re-adopted 4 of 4 worker(s)" in err, err[-3000:]
    records = list(read_records(job.logs))
    views = check_job(records, samples=64, epochs=None)
    assert [v.size for v in views] == [4], "a round was lost"
    assert not [r for r in records if r["event"] == "restore"]
    assert sorted(views[0].ranks_by_pid) == pids  # the same processes throughout
    assert_no_orphans(job.tag, within=15)


def test_sigterm_still_stops_every_local_worker(job: LocalJob) -> None:
    """Only an unclean loss leaves the workers running: a SIGTERM (or Ctrl-C) to the driver
    stops the whole job, its own agents included."""
    driver = job.driver()
    job.wait_steps(0, 3)
    driver.send_signal(signal.SIGTERM)
    _, err = driver.communicate(timeout=60)
    assert driver.returncode == 143, err[-3000:]
    assert_no_orphans(job.tag, within=15)


def test_resume_alone_needs_the_jobs_command_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = subprocess.run([PYTHON, "-m", "elasticrun", "--resume", "--state-dir", str(empty)],
                            capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"elasticrun: error: --resume --state-dir {empty}: no job's command line there "
        f"(command.json is missing); give the job's whole command line with --resume"]


def test_a_round_that_breaks_while_the_driver_is_away_waits_for_it(job: LocalJob) -> None:
    """A worker dies while there is no driver: its peers' collectives fail and they wait
    (asking for the next round, within --driver-grace); the resumed driver learns of the
    exit from the worker's agent, the survivors go on from their commit, and the dead
    worker's slot gets a new worker that joins them."""
    first = job.driver()
    job.wait_steps(0, 3)
    first.kill()
    first.communicate()
    logged = {r["pid"]: r["host"] for r in read_records(job.logs) if r["event"] == "round"}
    victim = next(pid for pid in job.workers() if logged.get(pid) == "127.0.0.1")
    os.kill(victim, signal.SIGKILL)
    time.sleep(1.0)  # the survivors' step fails; they wait for a driver
    stalled = job.step()
    time.sleep(1.0)
    assert job.step() == stalled  # nobody trains on a broken round
    second = job.short_resume()
    job.wait_steps(job.step(), 5)
    job.stop.touch()
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err[-3000:]
    assert re.search(r"slot 127\.0\.0\.1\[\d\] gets a new worker", err), err[-3000:]
    records = list(read_records(job.logs))
    views = check_job(records, samples=64, epochs=None)
    assert [v.size for v in views][:2] == [4, 3] and views[-1].size in (3, 4), views
    assert set(views[1].hosts_by_rank.values()) == {"localhost", "127.0.0.1"}
    assert_no_orphans(job.tag, within=15)


def test_a_driver_killed_in_a_rendezvous_resumes_it_or_cuts_a_fresh_one(job: LocalJob) -> None:
    """A worker dies and a peer is stopped (SIGSTOP): the next round waits for the stopped
    one, and the driver is SIGKILLed in that rendezvous. The members retry their joins
    against the resumed driver: if those complete the round before every worker's agent
    has reported, the round goes on there (no second rollback); else it is broken and a
    fresh one is cut with the workers back. Either way every sample is trained exactly
    once per epoch, from states really committed."""
    first = job.driver()
    job.wait_steps(0, 3)
    logged = {r["pid"]: r["host"] for r in read_records(job.logs) if r["event"] == "round"}
    victim = next(pid for pid in job.workers() if logged.get(pid) == "127.0.0.1")
    stopped = next(pid for pid in job.workers() if logged.get(pid) == "localhost")
    os.kill(stopped, signal.SIGSTOP)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while (kept := _journal_round(job.state)) is None or kept["number"] < 2:
        assert time.monotonic() < deadline, "no next round"
        time.sleep(0.01)
    first.kill()
    first.communicate()
    os.kill(stopped, signal.SIGCONT)
    kept = _journal_round(job.state)
    assert kept["number"] == 2 and not kept["complete"], "not killed in the rendezvous"
    second = job.short_resume()
    job.wait_steps(job.step(), 5)
    job.stop.touch()
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err[-3000:]
    views = check_job(list(read_records(job.logs)), samples=64, epochs=None)
    # (a new worker that had not started when the driver died is not waited for)
    assert re.search(r"re-adopted \d of \d worker\(s\)", err), err[-3000:]
    # The survivors' round (its own, or a fresh one), then the killed worker's new one joins
    survivors = views[1]
    assert (views[0].number, views[0].size) == (1, 4) and survivors.number in (2, 3), views
    assert {v.size for v in views[1:]} <= {3, 4}, views
    if survivors.number == 2:
        assert survivors.size == 3, views
        assert "a fresh round is cut" not in err
        restores = Counter(r["pid"] for r in read_records(job.logs) if r["event"] == "restore")
        assert all(restores[pid] <= 1 for pid in survivors.ranks_by_pid), restores
    else:  # (the fresh round takes the killed worker's new one too if it is up by then)
        assert "a fresh round is cut: the driver stopped while a round was forming" in err
    assert_no_orphans(job.tag, within=15)


def _journal_round(state_dir: Path) -> Any:
    """The round the journal holds now (None: none yet, or a file being replaced)."""
    try:
        return json.loads((state_dir / "journal.json").read_text())["body"]["state"]["round"]
    except (OSError, ValueError, KeyError):
        return None
