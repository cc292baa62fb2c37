"""Keeps the host list current: polls discovery every interval, or at once when woken.

A webhook push wakes the watcher, so a pushed change takes effect immediately instead of at
the next poll. After every poll the driver is told, and decides whether the round changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from elasticrun.discovery.base import HostDiscovery, HostSlots
from elasticrun.discovery.parsing import format_host
from elasticrun.discovery.webhook import PushableDiscovery
from elasticrun.driver.hosts import HostRegistry
from elasticrun.driver.telemetry import Telemetry
from elasticrun.errors import DiscoveryError

log = logging.getLogger("elasticrun.driver")


class PushRefused(Exception):
    """A host-change push that cannot be applied; the message says why."""


class HostWatcher:
    def __init__(self, discovery: HostDiscovery, registry: HostRegistry, interval: float,
                 telemetry: Telemetry) -> None:
        self._discovery = discovery
        self._registry = registry
        self._interval = interval
        self._telemetry = telemetry
        self._woken = asyncio.Event()
        self._poll_due = False
        self.last_error: str | None = None

    def describe(self) -> str:
        return self._discovery.describe()

    async def first_poll(self) -> None:
        """The first discovery call; its failure is the job's (one line, before anything runs)."""
        started = time.monotonic()
        try:
            hosts = await self._discovery.find_hosts()
        except DiscoveryError:
            self._telemetry.discovery_polled(time.monotonic() - started, failed=True)
            raise
        self._telemetry.discovery_polled(time.monotonic() - started, failed=False)
        self._registry.update(hosts)  # the job_started event lists them

    async def poll(self) -> None:
        """Asks discovery; a failure or hang keeps the last good host list (logged once)."""
        started = time.monotonic()
        try:
            hosts = await self._discovery.find_hosts()
        except DiscoveryError as exc:
            self._telemetry.discovery_polled(time.monotonic() - started, failed=True)
            if str(exc) != self.last_error:
                log.warning("%s; keeping the last good host list", exc)
                self.last_error = str(exc)
            return
        self._telemetry.discovery_polled(time.monotonic() - started, failed=False)
        if self.last_error is not None:
            log.info("%s answers again", self._discovery.describe())
            self.last_error = None
        self._update(hosts)

    def _update(self, hosts: HostSlots) -> None:
        old = self._registry.discovered
        if hosts != old:
            log.info("hosts now: %s", format_hosts(hosts) or "none")
            self._registry.update(hosts)
            self._telemetry.hosts_changed(old, hosts)

    def wake(self, poll: bool) -> None:
        """Ends the current wait early; with `poll`, discovery is asked again first."""
        self._poll_due = self._poll_due or poll
        self._woken.set()

    async def wait_and_poll(self, timeout: float) -> None:
        """Waits up to `timeout` (less if woken), then polls if the interval passed or a
        push asked for it."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._woken.wait(), max(0.0, timeout))
        woken = self._woken.is_set()
        self._woken.clear()
        if not woken or self._poll_due:
            self._poll_due = False
            await self.poll()

    async def run(self, after_poll: Callable[[], Awaitable[None]]) -> None:
        while True:
            await self.wait_and_poll(self._interval)
            await after_poll()

    # --- pushes from the host-change webhook ---------------------------------------------
    def push(self, action: str, hosts: HostSlots) -> dict[str, object]:
        """Applies one push; returns what changed. Raises PushRefused."""
        discovery = self._discovery
        if action == "drain":
            unknown = [h for h in hosts if h not in self._registry.discovered]
            drained = [h for h in hosts if h not in unknown and h not in self._registry.drained]
            for host in drained:
                self._registry.drain(host)
                self._telemetry.host_drained(host)
                log.warning("host %s drained: its workers leave at the next commit",
                            format_host(host))
            self.wake(poll=False)
            return {"drained": drained, "unknown": unknown}
        if not isinstance(discovery, PushableDiscovery):
            raise PushRefused(
                f"hosts come from {discovery.describe()}; only 'drain' applies. Start the job "
                f"with --discovery webhook to push host lists")
        if action == "set":
            discovery.set_hosts(hosts)
            changed: Iterable[str] = hosts
        elif action == "add":
            discovery.add_hosts(hosts)
            for host in hosts:
                self._registry.undrain(host)
            changed = hosts
        elif action == "remove":
            changed = discovery.remove_hosts(hosts)
        else:
            raise PushRefused(f"unknown action {action!r}")
        self.wake(poll=True)
        return {action if action != "set" else "hosts": list(changed)}


def format_hosts(hosts: HostSlots) -> str:
    return ",".join(f"{format_host(h)}:{n}" for h, n in hosts.items())
