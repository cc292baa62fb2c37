"""Keeps the host list current: polls discovery every interval, or at once when woken.

A webhook push wakes the watcher, so a pushed change takes effect immediately instead of at
the next poll. Every answer goes to the driver as it is; the round machine decides what it
means. Every call is bounded: a discovery plugin that hangs, or fails with an error of its
own, fails that poll (a script's own timeout, --discovery-timeout, comes first).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable

from elasticrun.discovery.base import HostDiscovery, HostSlots
from elasticrun.discovery.webhook import PushableDiscovery
from elasticrun.job.errors import DiscoveryError
from elasticrun.system.timed import within

log = logging.getLogger("elasticrun.driver")


class PushRefused(Exception):
    """A host-change push that cannot be applied; the message says why."""


class HostWatcher:
    def __init__(self, discovery: HostDiscovery, interval: float,
                 polled: Callable[[float, bool], None], answer_within: float) -> None:
        """`polled(seconds, failed)` hears how every discovery call went; a call that takes
        longer than `answer_within` seconds fails."""
        self._discovery = discovery
        self._interval = interval
        self._answer_within = answer_within
        self._polled = polled
        self._woken = asyncio.Event()
        self._poll_due = False
        self.last_error: str | None = None

    def describe(self) -> str:
        return self._discovery.describe()

    async def first_poll(self) -> HostSlots:
        """The first discovery call; its failure is the job's (one line, before anything runs)."""
        started = time.monotonic()
        try:
            hosts = await self._ask()
        except DiscoveryError:
            self._polled(time.monotonic() - started, True)
            raise
        self._polled(time.monotonic() - started, False)
        return hosts

    async def poll(self) -> HostSlots | None:
        """Asks discovery; a failure or hang keeps the last good host list (logged once)."""
        started = time.monotonic()
        try:
            hosts = await self._ask()
        except DiscoveryError as exc:
            self._polled(time.monotonic() - started, True)
            if str(exc) != self.last_error:
                log.warning("%s; keeping the last good host list", exc)
                self.last_error = str(exc)
            return None
        self._polled(time.monotonic() - started, False)
        if self.last_error is not None:
            log.info("%s answers again", self._discovery.describe())
            self.last_error = None
        return hosts

    async def _ask(self) -> HostSlots:
        try:
            return await within(self._discovery.find_hosts(), self._answer_within)
        except DiscoveryError:
            raise
        except TimeoutError:
            raise DiscoveryError(f"{self.describe()} did not answer within "
                                 f"{self._answer_within:g}s") from None
        except Exception as exc:  # a plugin's own bug: that poll fails, the job goes on
            raise DiscoveryError(f"{self.describe()} failed: {exc!r}") from None

    def wake(self, poll: bool) -> None:
        """Ends the current wait early; with `poll`, discovery is asked again first."""
        self._poll_due = self._poll_due or poll
        self._woken.set()

    async def run(self, found: Callable[[HostSlots], None]) -> None:
        """Polls every interval (or at once when woken), passing every answer to `found`."""
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await within(self._woken.wait(), self._interval)
            woken = self._woken.is_set()
            self._woken.clear()
            if not woken or self._poll_due:
                self._poll_due = False
                hosts = await self.poll()
                if hosts is not None:
                    found(hosts)

    # --- pushes from the host-change webhook ---------------------------------------------
    def push(self, action: str, hosts: HostSlots) -> dict[str, object]:
        """Applies one push to the discovery source (set, add, remove); returns what
        changed. Raises PushRefused. Draining is the round machine's (a host state)."""
        discovery = self._discovery
        if not isinstance(discovery, PushableDiscovery):
            raise PushRefused(
                f"hosts come from {discovery.describe()}; only 'drain' applies. Start the job "
                f"with --discovery webhook to push host lists")
        if action == "set":
            discovery.set_hosts(hosts)
            changed: Iterable[str] = hosts
        elif action == "add":
            discovery.add_hosts(hosts)
            changed = hosts
        elif action == "remove":
            changed = discovery.remove_hosts(hosts)
        else:
            raise PushRefused(f"unknown action {action!r}")
        self.wake(poll=True)
        return {action if action != "set" else "hosts": list(changed)}

