"""The key-value store behind the workers' torch.distributed.Store, in the driver's event loop.

Waiting for keys is event-driven: a waiter sleeps until the key is set or its
deadline passes, never polling. It sleeps on a future and a timer (not a task per wait:
every member of a round waits on its peers' keys at once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


class KVStore:
    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._waiters: dict[str, list[asyncio.Future[bool]]] = {}
        self._closed = False
        self._abandoned: list[str] = []

    def __len__(self) -> int:
        return len(self._data)

    def set(self, key: str, value: bytes) -> None:
        self._data[key] = value
        if key in self._waiters:
            _wake(self._waiters.pop(key))

    def get(self, key: str) -> bytes | None:
        return self._data.get(key)

    def add(self, key: str, amount: int) -> int:
        current = self._data.get(key, b"0")
        try:
            value = int(current) + amount
        except ValueError:
            raise ValueError(f"key {key!r} does not hold an integer") from None
        self.set(key, str(value).encode())
        return value

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """torch.distributed semantics: set `desired` if the current value is `expected`
        (a missing key matches an empty `expected`); return the value now held."""
        current = self._data.get(key)
        if current is None:
            if expected == b"":
                self.set(key, desired)
                return desired
            return expected
        if current == expected:
            self.set(key, desired)
            return desired
        return current

    def check(self, keys: Iterable[str]) -> bool:
        return all(key in self._data for key in keys)

    def delete(self, key: str) -> bool:
        return self._data.pop(key, None) is not None

    def delete_prefix(self, prefix: str) -> int:
        doomed = [key for key in self._data if key.startswith(prefix)]
        for key in doomed:
            del self._data[key]
        self._abandoned = [p for p in self._abandoned if not p.startswith(prefix)]
        for key in [key for key in self._waiters if key.startswith(prefix)]:
            _wake(self._waiters.pop(key))  # waiters of a dead round re-check and time out
        return len(doomed)

    def abandon_prefix(self, prefix: str) -> None:
        """Keys under `prefix` will never be needed: their waiters give up now."""
        self._abandoned.append(prefix)
        for key in [key for key in self._waiters if key.startswith(prefix)]:
            _wake(self._waiters.pop(key))

    def is_abandoned(self, key: str) -> bool:
        return bool(self._abandoned) and any(key.startswith(p) for p in self._abandoned)

    def wake_all(self) -> None:
        """Wakes every waiter (at shutdown); each re-checks its keys and gives up."""
        self._closed = True
        for waiters in self._waiters.values():
            _wake(waiters)
        self._waiters.clear()

    def num_keys(self) -> int:
        return len(self._data)

    async def wait(self, keys: list[str], timeout: float) -> bool:
        """True once every key exists; False if `timeout` seconds pass first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for key in keys:
            while key not in self._data:
                remaining = deadline - loop.time()
                if remaining <= 0 or self._closed or self.is_abandoned(key):
                    return False
                if not await self._woken(loop, key, remaining):
                    return False
        return True

    async def _woken(self, loop: asyncio.AbstractEventLoop, key: str, timeout: float) -> bool:
        """Sleeps until `key` is set (or its round is dropped, or the store closes): True;
        or until `timeout` seconds pass: False."""
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiters.setdefault(key, []).append(waiter)
        timer = loop.call_later(timeout, _settle, waiter, False)
        woken = False
        try:
            woken = await waiter
            return woken
        finally:
            timer.cancel()
            if not woken:  # timed out, or the request was cancelled
                _forget(self._waiters, key, waiter)


def _settle(waiter: asyncio.Future[bool], value: bool) -> None:
    if not waiter.done():
        waiter.set_result(value)


def _wake(waiters: list[asyncio.Future[bool]]) -> None:
    for waiter in waiters:
        _settle(waiter, True)


def _forget(waiters: dict[str, list[asyncio.Future[bool]]], key: str,
            waiter: asyncio.Future[bool]) -> None:
    """Drops a waiter that was not woken (it timed out, or its request was cancelled)."""
    listed = waiters.get(key)
    if listed is not None and waiter in listed:
        listed.remove(waiter)
        if not listed:
            del waiters[key]
