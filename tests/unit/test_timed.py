"""`within`: a bounded wait that never loses a cancellation (asyncio.wait_for on Python
3.10/3.11 returns the result instead when both happen at once, gh-86296), and the discovery
watcher, which polls through it, stopping whenever it is told to."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from elasticrun.discovery.script import ScriptDiscovery
from elasticrun.driver.hosts.watcher import HostWatcher
from elasticrun.system.timed import within


async def test_a_cancellation_as_the_awaited_thing_finishes_is_not_lost() -> None:
    """The exact race: the awaited result is ready, the caller's wake-up is scheduled, and
    the caller is cancelled before it runs. wait_for (3.10, 3.11) returns the result here
    and the caller's loop runs on; within raises CancelledError."""
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    rounds = 0

    async def poll_forever() -> None:
        nonlocal rounds
        while True:  # the shape of the discovery watcher's loop
            await within(gate if rounds == 0 else asyncio.sleep(0.01), 10)
            rounds += 1

    task = asyncio.ensure_future(poll_forever())
    await asyncio.sleep(0.01)
    gate.set_result("hosts")
    await asyncio.sleep(0)  # the result is in; the caller has not resumed yet
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2)
    assert done and task.cancelled() and rounds == 0


async def test_within_returns_the_result_or_raises_its_error() -> None:
    async def answer() -> int:
        await asyncio.sleep(0.01)
        return 42

    async def broken() -> None:
        raise ValueError("bad host line")

    assert await within(answer(), 5) == 42
    with pytest.raises(ValueError, match="bad host line"):
        await within(broken(), 5)


async def hang(stopped: asyncio.Event) -> None:
    try:
        await asyncio.sleep(60)
    finally:
        stopped.set()


async def test_within_times_out_and_stops_what_it_waited_for() -> None:
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(asyncio.TimeoutError):
        await within(hang(stopped), 0.05)
    assert stopped.is_set() and loop.time() - started < 2


async def test_cancelling_the_caller_cancels_what_it_waits_for() -> None:
    stopped = asyncio.Event()
    task = asyncio.ensure_future(within(hang(stopped), 30))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stopped.is_set()


async def test_the_discovery_watcher_stops_whenever_it_is_cancelled(tmp_path: Path) -> None:
    """A real discovery script polled back to back, cancelled at random moments: some land
    as a poll completes. Each time the watcher must stop. (With wait_for about 1 in 100
    cancellations was lost, and the watcher polled on forever: the launcher never exited.
    So this catches a regression often, not always; the test above pins the race itself.)"""
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho a:1\n")
    script.chmod(0o755)
    rng = random.Random(3)
    polls = 0

    def found(_: object) -> None:
        nonlocal polls
        polls += 1

    cancelled = 0
    # 100 cancellations at least, and as many more as it takes for 50 polls to complete (a
    # loaded machine starts the script slowly): the cancellations land among completed polls
    while cancelled < 100 or polls <= 50:
        assert cancelled < 1000, f"only {polls} polls completed in {cancelled} rounds"
        watcher = HostWatcher(ScriptDiscovery(script, 1, 5.0), 0.0, lambda s, f: None, 10.0)
        task = asyncio.ensure_future(watcher.run(found))
        await asyncio.sleep(rng.uniform(0.0, 0.05))
        task.cancel()
        cancelled += 1
        done, _ = await asyncio.wait({task}, timeout=2)
        assert done, "the watcher went on polling after it was cancelled"
