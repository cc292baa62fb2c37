"""A torch.distributed.Store backed by the driver's key-value store.

Blocking reads long-poll the driver (no busy polling). Keep a reference to the store
object for as long as a process group uses it: torch calls back into this Python
object, and it must stay alive.
"""

from __future__ import annotations

import base64
import datetime
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

    def _kv(self, op: str, wait: float = 0.0, **payload: Any) -> dict[str, Any]:
        payload["worker"] = self._worker_id
        try:
            return self._client.call(protocol.PATH_KV_PREFIX + op, payload, wait=wait)
        except RequestRefusedError as exc:
            if exc.status == 410:  # the round broke while we were building its group
                raise dist.DistStoreError(str(exc)) from None
            raise

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._timeout_s = timeout.total_seconds()

    def set(self, key: str, value: Any) -> None:
        self._kv("set", key=key, value=_encode(value))

    def get(self, key: str) -> bytes:
        deadline = time.monotonic() + self._timeout_s
        while True:
            wait = min(protocol.MAX_POLL_S, max(0.0, deadline - time.monotonic()))
            value = self._kv("get", wait=wait, key=key, timeout=wait)["value"]
            if value is not None:
                return _decode(value)
            if time.monotonic() >= deadline:
                raise dist.DistStoreError(
                    f"timed out after {self._timeout_s:g}s waiting for key {key!r}")

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self.wait(keys)
        values = self._kv("multi_get", keys=list(keys), timeout=0.0)["values"]
        return [_decode(v) for v in values]

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
        limit = timeout.total_seconds() if timeout is not None else self._timeout_s
        deadline = time.monotonic() + limit
        while True:
            wait = min(protocol.MAX_POLL_S, max(0.0, deadline - time.monotonic()))
            if self._kv("wait", wait=wait, keys=list(keys), timeout=wait)["ready"]:
                return
            if time.monotonic() >= deadline:
                raise dist.DistStoreError(f"timed out after {limit:g}s waiting for keys {keys}")

    def delete_key(self, key: str) -> bool:
        return bool(self._kv("delete", key=key)["deleted"])

    def num_keys(self) -> int:
        return int(self._kv("num_keys")["count"])
