"""A discovery command cancelled (the job is ending) is gone, with everything it started, by
the time the cancellation returns: the driver may exit right after. Seen under load: a job
that failed while a poll of its discovery script was starting left /bin/sh discover.sh
behind (asyncio, cancelled while connecting a child's pipes, kills the child alone and then
waits for pipes that its children hold), and the loop closed with the transport open."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import pytest

from elasticrun.discovery.commands import run_command

TAG = "ELASTICRUN_TEST_COMMAND_TAG"


def _tagged(tag: str) -> list[int]:
    """Live (not zombie) processes whose environment holds TAG=tag."""
    needle = f"{TAG}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "environ").read_bytes().split(b"\0") \
                    and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("when", ["while-starting", "while-running"])
async def test_a_cancelled_command_leaves_nothing_behind(tmp_path: Path, when: str) -> None:
    started = tmp_path / "started"
    script = tmp_path / "hosts.sh"
    script.write_text(f"#!/bin/sh\nsleep 60 &\ntouch {started}\nwait\n")
    script.chmod(0o755)
    tag = uuid.uuid4().hex
    task = asyncio.ensure_future(run_command([str(script)], 30.0, "discovery script",
                                             env={**os.environ, TAG: tag}))
    if when == "while-starting":
        await asyncio.sleep(0)  # the child is forked; its pipes are being connected
    else:
        while not started.exists():
            await asyncio.sleep(0.01)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=10)
    assert done and task.cancelled(), "the cancellation waited on the command's children"
    deadline = time.monotonic() + 2.0  # the killed `sleep` is init's to reap
    while (left := _tagged(tag)) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert not left, f"the command left processes behind: {left}"
