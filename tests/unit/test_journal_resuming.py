"""Reading a job back for --resume: what a journal directory gives, or one line why not."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from elasticrun.driver.hosts.registry import HostRegistry
from elasticrun.driver.journal.files import JournalError, JournalFiles
from elasticrun.driver.journal.opening import SECRET_FILE, JobRecord, open_journal
from elasticrun.driver.journal.resuming import load
from elasticrun.driver.rounds.state import JobPhase
from tests.unit.test_journal_codec import recovered_job

JOB = JobRecord("0123456789ab", 3, 45678, ("python", "train.py"), 4242)


def hosts() -> HostRegistry:
    return HostRegistry((10.0, 100.0), random.Random(0))


async def write_job(directory: Path) -> None:
    sim = recovered_job()
    writer = await open_journal(directory, JOB, "s3cr3t", sim.state)
    await writer.close()


async def test_a_journal_reads_back_as_the_job_it_was(tmp_path: Path) -> None:
    await write_job(tmp_path / "state")
    resumed = load(tmp_path / "state", hosts())
    assert resumed.job == JOB and resumed.secret == "s3cr3t" and resumed.source == "current"
    assert resumed.state.round_number == recovered_job().state.round_number
    assert resumed.state.hosts.blacklist_snapshot()
    assert resumed.written_at > 0


async def test_a_missing_or_empty_secret_is_one_line(tmp_path: Path) -> None:
    directory = tmp_path / "state"
    await write_job(directory)
    (directory / SECRET_FILE).write_text("")
    with pytest.raises(JournalError, match="secret file is empty") as empty:
        load(directory, hosts())
    os.unlink(directory / SECRET_FILE)
    with pytest.raises(JournalError, match="secret file") as missing:
        load(directory, hosts())
    for error in (empty, missing):
        assert "\n" not in str(error.value) and str(directory) in str(error.value)


def test_no_journal_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match="no valid journal snapshot") as error:
        load(tmp_path / "nothing", hosts())
    assert "\n" not in str(error.value)


async def test_a_snapshot_of_something_else_is_one_line(tmp_path: Path) -> None:
    """A valid snapshot file whose body is not a job (another version, a hand edit)."""
    directory = tmp_path / "state"
    await write_job(directory)
    files = JournalFiles(directory)
    body = files.read().body
    del body["state"]["workers"]
    files.write(body)
    files.write(body)  # the previous one, too: no good snapshot left
    with pytest.raises(JournalError, match="not one this elasticrun wrote") as error:
        load(directory, hosts())
    assert "\n" not in str(error.value)
    assert json.loads((directory / "journal.json").read_text())["body"]["job"]["id"] == JOB.id


async def test_an_ended_job_is_not_resumed(tmp_path: Path) -> None:
    directory = tmp_path / "state"
    sim = recovered_job()
    sim.state.phase = JobPhase.STOPPED
    writer = await open_journal(directory, JOB, "s3cr3t", sim.state)
    await writer.close()
    with pytest.raises(JournalError, match="had already ended") as error:
        load(directory, hosts())
    assert "\n" not in str(error.value) and JOB.id in str(error.value)
