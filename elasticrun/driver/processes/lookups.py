"""Host names to addresses without holding the driver: looked up in the background, at most
`concurrency` at a time, each answer awaited at most `timeout` seconds.

The driver's loop never calls the system resolver: a discovery list of 10,000 names that
need DNS would otherwise hold the server's start and every signal for minutes. A lookup
runs in a daemon thread (getaddrinfo cannot be cancelled; a daemon thread does not hold
the process's exit); a slot is free again only when its thread has ended, so no more than
`concurrency` threads ever resolve, however many lookups time out. IP literals are never
looked up.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterable

from elasticrun.system.timed import within

Resolver = Callable[[str], list[str]]  # a name -> its addresses; may block, may raise OSError

LOOKUP_TIMEOUT_S = 5.0
CONCURRENCY = 32


class Pending:
    """known(): the name's lookup has not ended yet."""


PENDING = Pending()


def system_resolver(name: str) -> list[str]:
    """The addresses `name` stands for, IPv4 first (as address_towards dials them)."""
    infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    found = dict.fromkeys(str(info[4][0]) for info in infos)
    return sorted(found, key=lambda address: ":" in address)


def numeric(host: str) -> str | None:
    """`host` itself when it is an IP address (an IPv6 one may carry a scope id)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return None
    return host


class HostLookups:
    def __init__(self, resolver: Resolver = system_resolver,
                 concurrency: int = CONCURRENCY, timeout: float = LOOKUP_TIMEOUT_S) -> None:
        self._resolver = resolver
        self._concurrency = concurrency
        self._timeout = timeout
        self._found: dict[str, str | None] = {}  # None: it did not resolve in time
        self._queue: deque[str] = deque()
        self._queued: set[str] = set()
        self._waiters: dict[str, asyncio.Future[str | None]] = {}
        self._runners: set[asyncio.Task[None]] = set()
        self.threads = 0  # resolving now (tests check the bound)

    def known(self, host: str) -> str | None | Pending:
        """The address `host` was found at, None if it was not (in time), PENDING while its
        lookup has not ended (or begun: start() it)."""
        if (address := numeric(host)) is not None:
            return address
        return self._found.get(host, PENDING)

    def start(self, hosts: Iterable[str]) -> None:
        """Queues a lookup of each name not known or queued yet (in order). Needs a loop."""
        for host in hosts:
            if host not in self._found and host not in self._queued and numeric(host) is None:
                self._queue.append(host)
                self._queued.add(host)
        while len(self._runners) < self._concurrency and self._queue:
            runner = asyncio.get_running_loop().create_task(self._run())
            self._runners.add(runner)
            runner.add_done_callback(self._runners.discard)

    async def address(self, host: str) -> str | None:
        """The address of `host` (None: it did not resolve within the timeout), once its
        lookup, queued now if need be, has ended."""
        found = self.known(host)
        if not isinstance(found, Pending):
            return found
        waiter = self._waiters.get(host)
        if waiter is None:
            waiter = self._waiters[host] = asyncio.get_running_loop().create_future()
        self.start([host])
        return await asyncio.shield(waiter)

    async def _run(self) -> None:
        while self._queue:
            host = self._queue.popleft()
            await self._lookup(host)

    async def _lookup(self, host: str) -> None:
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[list[str]] = loop.create_future()
        self.threads += 1
        threading.Thread(target=self._resolve, args=(host, loop, ended), daemon=True,
                         name=f"elasticrun-lookup-{host[:40]}").start()
        try:
            try:
                addresses = await within(asyncio.shield(ended), self._timeout)
            except TimeoutError:
                addresses = []
            self._answer(host, addresses[0] if addresses else None)
            await ended  # the slot is free once its thread is
        finally:
            self.threads -= 1

    def _answer(self, host: str, address: str | None) -> None:
        self._found[host] = address
        self._queued.discard(host)
        waiter = self._waiters.pop(host, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(address)

    def _resolve(self, host: str, loop: asyncio.AbstractEventLoop,
                 ended: asyncio.Future[list[str]]) -> None:
        try:
            addresses = self._resolver(host)
        except Exception:  # noqa: BLE001 - whatever a resolver raises, the name did not resolve
            addresses = []
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(_settle, ended, addresses)


def _settle(future: asyncio.Future[list[str]], addresses: list[str]) -> None:
    if not future.done():
        future.set_result(addresses)
