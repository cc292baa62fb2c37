"""The key-value store behind the workers' torch.distributed.Store, in the driver's event loop.

Waiting for keys is event-driven: a waiter sleeps until the key is set or its
deadline passes, never polling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from elasticrun.timed import within


class KVStore:
    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._waiters: dict[str, asyncio.Event] = {}
        self._closed = False
        self._abandoned: list[str] = []

    def __len__(self) -> int:
        return len(self._data)

    def set(self, key: str, value: bytes) -> None:
        self._data[key] = value
        event = self._waiters.pop(key, None)
        if event is not None:
            event.set()

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
            self._waiters.pop(key).set()  # wake waiters of a dead round; they re-check and time out
        return len(doomed)

    def abandon_prefix(self, prefix: str) -> None:
        """Keys under `prefix` will never be needed: their waiters give up now."""
        self._abandoned.append(prefix)
        for key in [key for key in self._waiters if key.startswith(prefix)]:
            self._waiters.pop(key).set()

    def is_abandoned(self, key: str) -> bool:
        return any(key.startswith(prefix) for prefix in self._abandoned)

    def wake_all(self) -> None:
        """Wakes every waiter (at shutdown); each re-checks its keys and gives up."""
        self._closed = True
        for event in self._waiters.values():
            event.set()
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
                event = self._waiters.setdefault(key, asyncio.Event())
                try:
                    await within(event.wait(), remaining)
                except asyncio.TimeoutError:
                    return False
        return True
