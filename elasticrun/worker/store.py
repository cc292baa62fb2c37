"""A torch.distributed.Store backed by the driver's key-value store.

Blocking reads long-poll the driver (no busy polling). Keep a reference to the store
object for as long as a process group uses it: torch calls back into this Python
object, and it must stay alive.

Every call is an HTTP request to the driver, so the store saves round-trips where it can.
Gloo connects a group by waiting for each rank's address key and then getting it (torch
2.13: one `set`, then `wait([key])` + `get(key)` per rank, never `multi_get`). So `wait`
fetches the values it waited for (the server's `multi_get`, which long-polls too), and a
`get` of one of those keys that is the very next call on the same thread is answered from
them: one request per peer instead of two. That `get` returns the value the `wait` saw;
any other call on the thread forgets the fetched values, so a later `get` asks the driver.
"""

from __future__ import annotations

import base64
import datetime
import threading
import time
from typing import Any

import torch.distributed as dist

from elasticrun import protocol
from elasticrun.worker.client import DriverClient, RequestRefusedError


def _encode(value: Any) -> str:
    if isinstance(value, str):
        value = value.encode()
    return base64.b64encode(bytes(value)).decode()


def _decode(text: str) -> bytes:
    return base64.b64decode(text)


class DriverStore(dist.Store):
    def __init__(self, client: DriverClient, worker_id: str, timeout: float = 300.0) -> None:
        super().__init__()
        self._client = client
        self._worker_id = worker_id  # the driver lets only a round's members use its keys
        self._timeout_s = timeout
        self._local = threading.local()  # .fetched: what this thread's last `wait` saw

    def _kv(self, op: str, wait: float = 0.0, **payload: Any) -> dict[str, Any]:
        self._local.fetched = None
        payload["worker"] = self._worker_id
        try:
            return self._client.call(protocol.PATH_KV_PREFIX + op, payload, wait=wait)
        except RequestRefusedError as exc:
            if exc.status == 410:  # the round broke while we were building its group
                raise dist.DistStoreError(str(exc)) from None
            raise

    def _fetch(self, keys: list[str], limit: float) -> list[bytes]:
        """The values of `keys`, once all exist (long-polling); DistStoreError after `limit`."""
        deadline = time.monotonic() + limit
        while True:
            wait = min(protocol.MAX_POLL_S, max(0.0, deadline - time.monotonic()))
            values = self._kv("multi_get", wait=wait, keys=keys, timeout=wait)["values"]
            if values is not None:
                return [_decode(v) for v in values]
            if time.monotonic() >= deadline:
                raise dist.DistStoreError(f"timed out after {limit:g}s waiting for keys {keys}")

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._timeout_s = timeout.total_seconds()

    def has_extended_api(self) -> bool:
        return True  # multi_get, multi_set and append work (append through compare_set)

    def set(self, key: str, value: Any) -> None:
        self._kv("set", key=key, value=_encode(value))

    def get(self, key: str) -> bytes:
        fetched: dict[str, bytes] | None = getattr(self._local, "fetched", None)
        if fetched is not None and key in fetched:
            self._local.fetched = None
            return fetched[key]
        return self._fetch([key], self._timeout_s)[0]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._fetch(list(keys), self._timeout_s)

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        for key, value in zip(keys, values, strict=True):
            self.set(key, value)

    def add(self, key: str, amount: int) -> int:
        return int(self._kv("add", key=key, amount=int(amount))["value"])

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        result = self._kv("compare_set", key=key, expected=_encode(expected),
                          desired=_encode(desired))
        return _decode(result["value"])

    def check(self, keys: list[str]) -> bool:
        return bool(self._kv("check", keys=list(keys))["ready"])

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        keys = list(keys)
        limit = timeout.total_seconds() if timeout is not None else self._timeout_s
        values = self._fetch(keys, limit)
        self._local.fetched = dict(zip(keys, values, strict=True))

    def delete_key(self, key: str) -> bool:
        return bool(self._kv("delete", key=key)["deleted"])

    def num_keys(self) -> int:
        return int(self._kv("num_keys")["count"])
