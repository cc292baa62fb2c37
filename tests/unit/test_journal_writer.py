"""The journal writer: every change reaches the disk, coalesced, never piling up."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from elasticrun.driver.journal.files import JournalFiles
from elasticrun.driver.journal.writer import JournalWriter


async def test_marks_are_coalesced_and_the_newest_state_wins(tmp_path: Path) -> None:
    files = JournalFiles(tmp_path)
    state: dict[str, Any] = {"round": 0}
    writer = JournalWriter(files, lambda: dict(state), min_interval=0.05)
    for number in range(1, 1001):  # a burst of changes, as a round of joins
        state["round"] = number
        writer.mark()
    await writer.flush()
    assert files.read().body == {"round": 1000}
    assert writer.writes <= 3  # not a thousand
    await writer.close()


async def test_a_change_while_a_write_is_under_way_is_written_after_it(tmp_path: Path) -> None:
    files = JournalFiles(tmp_path)
    state: dict[str, Any] = {"round": 1}
    writer = JournalWriter(files, lambda: dict(state), min_interval=0.0)
    writer.mark()
    await asyncio.sleep(0)  # the first write has taken its body
    state["round"] = 2
    writer.mark()
    for _ in range(200):
        if files.current.exists() and files.read().body == {"round": 2}:
            break
        await asyncio.sleep(0.01)
    assert files.read().body == {"round": 2}
    await writer.close()


async def test_a_disk_that_fails_costs_a_warning_not_the_job(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    writer = JournalWriter(JournalFiles(blocker / "journal"), lambda: {"round": 1})
    await writer.flush()  # does not raise
    assert writer.writes == 1
    await writer.close()


async def test_the_heartbeat_rewrites_an_unchanged_state(tmp_path: Path) -> None:
    """A quiet job's journal is rewritten anyway: its age is how a resumed driver tells a
    live driver from a hung one."""
    files = JournalFiles(tmp_path)
    beats = iter(range(1, 10_000))
    writer = JournalWriter(files, lambda: {"written": next(beats)}, min_interval=0.0)
    await writer.flush()
    assert files.read().body == {"written": 1}
    heart = asyncio.get_running_loop().create_task(writer.heartbeat(0.02))
    try:
        for _ in range(300):
            if files.read().body["written"] >= 4:
                break
            await asyncio.sleep(0.01)
        assert files.read().body["written"] >= 4
    finally:
        heart.cancel()
        await writer.close()
