"""Every discovery call is bounded: a plugin that hangs, or fails with an error of its own,
fails that poll with one line (the job's start, or the last good host list kept)."""

from __future__ import annotations

import asyncio

import pytest

from elasticrun.discovery.base import HostSlots
from elasticrun.driver.hosts.watcher import HostWatcher
from elasticrun.job.errors import DiscoveryError


class Plugin:
    """A discovery plugin whose answers the test sets: hosts, a hang, or an error."""

    def __init__(self) -> None:
        self.answer: HostSlots | BaseException | None = {"a": 1}

    async def find_hosts(self) -> HostSlots:
        if self.answer is None:
            await asyncio.Event().wait()  # never answers
        if isinstance(self.answer, BaseException):
            raise self.answer
        assert self.answer is not None
        return self.answer

    def describe(self) -> str:
        return "inventory plugin"


def _watcher(plugin: Plugin, polls: list[bool]) -> HostWatcher:
    return HostWatcher(plugin, 1.0, lambda seconds, failed: polls.append(failed), 0.2)


async def test_a_first_call_that_hangs_fails_the_start_in_one_line() -> None:
    plugin, polls = Plugin(), []
    plugin.answer = None
    with pytest.raises(DiscoveryError, match=r"^inventory plugin did not answer within 0.2s$"):
        await _watcher(plugin, polls).first_poll()
    assert polls == [True]


async def test_a_plugin_error_of_its_own_fails_the_start_naming_it() -> None:
    plugin, polls = Plugin(), []
    plugin.answer = RuntimeError("inventory down")
    with pytest.raises(DiscoveryError, match=r"inventory plugin failed: RuntimeError"):
        await _watcher(plugin, polls).first_poll()


async def test_a_hang_or_an_error_later_keeps_the_last_good_list() -> None:
    plugin, polls = Plugin(), []
    watcher = _watcher(plugin, polls)
    assert await watcher.first_poll() == {"a": 1}
    plugin.answer = None
    assert await watcher.poll() is None
    assert watcher.last_error == "inventory plugin did not answer within 0.2s"
    plugin.answer = KeyError("x")
    assert await watcher.poll() is None
    assert watcher.last_error == "inventory plugin failed: KeyError('x')"
    plugin.answer = {"a": 1, "b": 2}
    assert await watcher.poll() == {"a": 1, "b": 2}
    assert watcher.last_error is None
    assert polls == [False, True, True, False]


async def test_a_cancelled_poll_is_cancelled_not_failed() -> None:
    plugin, polls = Plugin(), []
    plugin.answer = None
    task = asyncio.ensure_future(HostWatcher(plugin, 1.0, lambda s, f: polls.append(f),
                                             60.0).poll())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert polls == []
