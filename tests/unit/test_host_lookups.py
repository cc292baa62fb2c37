"""Discovered hosts are placed without holding the driver: IP literals never reach a
resolver, names are looked up in the background, a bounded number at a time, each within a
timeout. No test here resolves a name through DNS: the resolver is injected."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from dataclasses import replace

from elasticrun.driver.processes.lookups import PENDING, HostLookups
from elasticrun.driver.processes.placement import LOOPBACK, Placement
from elasticrun.job.config import DriverConfig


def _config() -> DriverConfig:
    base = DriverConfig(command=("train",), np=1, min_np=1, max_np=None,
                        start_timeout=30.0, elastic_timeout=60.0, collective_timeout=10.0)
    return replace(base, discovery="script:./hosts.sh")


def _loopbacks(count: int) -> list[str]:
    return [f"127.{1 + n // 65536}.{n // 256 % 256}.{1 + n % 250}" for n in range(count)]


class _Blocking:
    """A resolver that holds every lookup until released, counting how many run at once."""

    def __init__(self, answer: str | None = "127.0.0.1") -> None:
        self.release = threading.Event()
        self.names: list[str] = []
        self.running = 0
        self.most = 0
        self._lock = threading.Lock()
        self._answer = answer

    def __call__(self, name: str) -> list[str]:
        with self._lock:
            self.names.append(name)
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            self.release.wait(10)
            if self._answer is None:
                raise OSError("no such host")
            return [self._answer]
        finally:
            with self._lock:
                self.running -= 1


class _Recording:
    def __init__(self) -> None:
        self.names: list[str] = []

    def __call__(self, name: str) -> list[str]:
        self.names.append(name)
        return []


async def test_10000_numeric_addresses_are_placed_at_once() -> None:
    """Before: each host's address scanned every host (O(n^2)): ~20 s for 10,000."""
    hosts = _loopbacks(10_000)
    resolver = _Recording()
    placement = Placement(_config(), object(), HostLookups(resolver))  # type: ignore[arg-type]
    start = time.monotonic()
    placement.set_hosts(hosts)
    addresses = {placement.address_for(host) for host in ["localhost", *hosts]}
    assert time.monotonic() - start < 3.0
    assert not placement.all_local and addresses == {LOOPBACK}
    await asyncio.wait_for(placement.ready("localhost"), 5)
    assert resolver.names == [socket.gethostname()]  # this machine's name, no address


async def test_a_name_never_holds_the_loop_and_is_ready_once_looked_up() -> None:
    resolver = _Blocking()
    placement = Placement(_config(), object(), HostLookups(resolver))  # type: ignore[arg-type]
    placement.set_hosts(["node-a.example", "127.0.0.1"])
    start = time.monotonic()
    assert placement.address_for("node-a.example") == LOOPBACK  # pending: not kept
    assert time.monotonic() - start < 0.5
    ready = asyncio.ensure_future(placement.ready("node-a.example"))
    await asyncio.sleep(0.1)
    assert not ready.done()
    resolver.release.set()
    await asyncio.wait_for(ready, 5)
    assert placement.address_for("node-a.example") == "127.0.0.1"
    assert "node-a.example" in resolver.names


async def test_lookups_run_a_bounded_number_at_a_time() -> None:
    resolver = _Blocking()
    lookups = HostLookups(resolver, concurrency=4, timeout=5.0)
    names = [f"node-{n}" for n in range(40)]
    lookups.start(names)
    await asyncio.sleep(0.2)
    assert resolver.running == 4 and lookups.threads == 4
    resolver.release.set()
    answers = await asyncio.wait_for(asyncio.gather(*(lookups.address(n) for n in names)), 10)
    assert answers == ["127.0.0.1"] * 40
    assert resolver.most == 4 and sorted(resolver.names) == sorted(names)


async def test_a_lookup_past_its_timeout_is_no_answer_and_keeps_its_slot() -> None:
    resolver = _Blocking()
    lookups = HostLookups(resolver, concurrency=2, timeout=0.2)
    try:
        start = time.monotonic()
        found = await asyncio.wait_for(
            asyncio.gather(*(lookups.address(n) for n in ("a", "b"))), 5)
        assert found == [None, None] and time.monotonic() - start < 2.0
        assert lookups.known("a") is None
        lookups.start(["c"])
        await asyncio.sleep(0.1)
        assert resolver.most == 2 and lookups.known("c") is PENDING  # no third thread
    finally:
        resolver.release.set()
    assert await asyncio.wait_for(lookups.address("c"), 5) == "127.0.0.1"


async def test_a_name_that_does_not_resolve_falls_back_to_this_machine() -> None:
    lookups = HostLookups(lambda name: [] if name.startswith("node") else ["127.0.0.1"])
    placement = Placement(_config(), object(), lookups)  # type: ignore[arg-type]
    placement.set_hosts(["node-gone"])
    await asyncio.wait_for(placement.ready("node-gone", ["node-gone"]), 5)
    assert placement.address_for("node-gone") == "127.0.0.1"


async def test_ip_literals_are_never_looked_up() -> None:
    resolver = _Recording()
    lookups = HostLookups(resolver)
    assert await lookups.address("10.1.2.3") == "10.1.2.3"
    assert lookups.known("fe80::1%lo") == "fe80::1%lo"
    lookups.start(["::1", "127.0.0.1"])
    assert resolver.names == []
