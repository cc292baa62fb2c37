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

Inside `full_mesh(size)` (a Gloo group of `size` ranks connecting on this thread), a
wait for a rank's address key (`<prefix>/<rank>`) also fetches every other rank's that
exists by then (the server's partial `multi_get`), and later waits and gets are answered
from them: a rank connects to its peers as they come, as with torch's TCPStore, in a
request per wave of arrivals instead of one per peer. Its own address rides along with its
first fetch: no request of its own.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist

from elasticrun import protocol
from elasticrun.worker.client import DriverClient, RequestRefusedError

_RANK_KEY = re.compile(r"(.*/)(\d+)")


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
        # .fetched: what this thread's last `wait` saw; .mesh_size and .mesh: the group of
        # full_mesh() connecting on this thread, and every rank's address key it fetched;
        # .unsent: this rank's own address, set with the next fetch
        self._local = threading.local()

    @contextlib.contextmanager
    def full_mesh(self, size: int) -> Iterator[None]:
        """While a Gloo group of `size` ranks connects on this thread through this store."""
        self._local.mesh_size, self._local.mesh = size, {}
        try:
            yield
        except BaseException:
            self._local.unsent = None  # the build failed: nobody needs this address
            raise
        finally:
            self._local.mesh_size, self._local.mesh = 0, None
        self._send_unsent()  # a group of one never fetched

    def _send_unsent(self) -> None:
        unsent: dict[str, str] | None = getattr(self._local, "unsent", None)
        if unsent is not None:
            self._local.unsent = None
            self._kv("set", key=unsent["set_key"], value=unsent["set_value"])

    def _from_mesh(self, keys: list[str], limit: float) -> dict[str, bytes] | None:
        """Within full_mesh(): the values of `keys` when they are rank address keys, fetched
        with every other rank's of the same prefix; None for any other keys."""
        size: int = getattr(self._local, "mesh_size", 0)
        mesh: dict[str, bytes] | None = getattr(self._local, "mesh", None)
        matches = [_RANK_KEY.fullmatch(key) for key in keys]
        if mesh is None or not all(m and int(m[2]) < size for m in matches):
            return None
        deadline = time.monotonic() + limit
        for match in matches:
            assert match is not None
            key, prefix = match[0], match[1]
            while key not in mesh:  # this key first, then every other rank's that exists
                others = [f"{prefix}{rank}" for rank in range(size)]
                wanted = [key, *(k for k in others if k not in mesh and k != key)]
                values = self._fetch(wanted, max(0.0, deadline - time.monotonic()),
                                     partial=True)
                mesh.update((k, v) for k, v in zip(wanted, values, strict=True)
                            if v is not None)
        return {key: mesh[key] for key in keys}

    def _kv(self, op: str, wait: float = 0.0, **payload: Any) -> dict[str, Any]:
        self._local.fetched = None
        if op == "multi_get" and payload.get("partial"):  # a mesh fetch carries the address
            payload.update(getattr(self._local, "unsent", None) or {})
            self._local.unsent = None
        else:
            self._send_unsent()
        payload["worker"] = self._worker_id
        try:
            return self._client.call(protocol.PATH_KV_PREFIX + op, payload, wait=wait)
        except RequestRefusedError as exc:
            if exc.status == 410:  # the round broke while we were building its group
                raise dist.DistStoreError(str(exc)) from None
            raise

    def _fetch(self, keys: list[str], limit: float, partial: bool = False) -> list[Any]:
        """The values of `keys`, once all exist (long-polling); DistStoreError after `limit`.
        `partial`: once the first exists, with None for each other one that does not."""
        deadline = time.monotonic() + limit
        extra = {"partial": True} if partial else {}
        while True:
            wait = min(protocol.MAX_POLL_S, max(0.0, deadline - time.monotonic()))
            values = self._kv("multi_get", wait=wait, keys=keys, timeout=wait,
                              **extra)["values"]
            if values is not None:
                return [None if v is None else _decode(v) for v in values]
            if time.monotonic() >= deadline:
                raise dist.DistStoreError(f"timed out after {limit:g}s waiting for keys {keys}")

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._timeout_s = timeout.total_seconds()

    def has_extended_api(self) -> bool:
        return True  # multi_get, multi_set and append work (append through compare_set)

    def set(self, key: str, value: Any) -> None:
        mesh: dict[str, bytes] | None = getattr(self._local, "mesh", None)
        if mesh is not None and _RANK_KEY.fullmatch(key):
            # its own address: sent with its first fetch of the others' (any other request
            # or leaving full_mesh() sends it first)
            self._send_unsent()
            mesh[key] = value.encode() if isinstance(value, str) else bytes(value)
            self._local.unsent = {"set_key": key, "set_value": _encode(value)}
            return
        self._kv("set", key=key, value=_encode(value))

    def get(self, key: str) -> bytes:
        meshed = self._from_mesh([key], self._timeout_s)
        if meshed is not None:
            return meshed[key]
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
        # The peers' addresses get the whole collective timeout to come, though the group
        # connects under a shorter one (torch/world/groups.py).
        meshed = self._from_mesh(keys, max(limit, self._timeout_s))
        if meshed is not None:
            return
        values = self._fetch(keys, limit)
        self._local.fetched = dict(zip(keys, values, strict=True))

    def delete_key(self, key: str) -> bool:
        return bool(self._kv("delete", key=key)["deleted"])

    def num_keys(self) -> int:
        return int(self._kv("num_keys")["count"])
