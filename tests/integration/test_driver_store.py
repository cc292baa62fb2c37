"""The workers' torch.distributed Store (elasticrun.worker.store.DriverStore) against a real
driver server: what it answers, and how many requests it takes to answer it."""

from __future__ import annotations

import asyncio
import collections
import datetime
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
import torch
import torch.distributed as dist

from elasticrun import protocol
from elasticrun.driver.rounds.assignment import SlotId
from elasticrun.worker.client import DriverClient, RequestRefusedError
from elasticrun.worker.store import DriverStore
from tests.rounds_server import RoundsServer

SECRET = protocol.new_secret()
WORKER = "tester"  # registered, member of no round: may use keys outside rounds

pytestmark = pytest.mark.timeout(60)


class CountingClient(DriverClient):
    """A real client that counts its store requests by operation."""

    def __init__(self, port: int) -> None:
        super().__init__("127.0.0.1", port, SECRET, unreachable_timeout=5)
        self.requests: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def call(self, path: str, payload: dict[str, Any], wait: float = 0.0) -> dict[str, Any]:
        with self._lock:
            self.requests[path.removeprefix(protocol.PATH_KV_PREFIX)] += 1
        return super().call(path, payload, wait)


@pytest_asyncio.fixture
async def rendezvous() -> AsyncIterator[RoundsServer]:
    """The real worker server, in front of a real round machine that knows WORKER."""
    rv = RoundsServer(SECRET)
    rv.add_worker(WORKER, SlotId("tester-host", 0))
    await rv.start()
    try:
        yield rv
    finally:
        await rv.stop()


def new_store(rv: RoundsServer, timeout: float = 10.0) -> tuple[DriverStore, CountingClient]:
    client = CountingClient(rv.port)
    return DriverStore(client, WORKER, timeout=timeout), client


async def blocking(function: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(function, *args)


async def test_get_right_after_wait_is_answered_from_what_the_wait_fetched(
        rendezvous: RoundsServer) -> None:
    store, client = new_store(rendezvous)
    rendezvous.store.set("a", b"1")
    rendezvous.store.set("b", b"2")

    def wait_then_get() -> tuple[bytes, bytes]:
        store.wait(["a", "b"])
        return store.get("b"), store.get("a")

    assert await blocking(wait_then_get) == (b"2", b"1")
    # One request for the wait and the first get; the second get asked the driver.
    assert client.requests == {"multi_get": 2}


async def test_any_other_call_forgets_what_the_wait_fetched(rendezvous: RoundsServer) -> None:
    store, client = new_store(rendezvous)
    rendezvous.store.set("k", b"old")

    def wait_set_get() -> bytes:
        store.wait(["k"])
        store.set("k", b"new")
        return store.get("k")

    assert await blocking(wait_set_get) == b"new"
    assert client.requests == {"multi_get": 2, "set": 1}


async def test_wait_and_multi_get_long_poll_in_one_request(rendezvous: RoundsServer) -> None:
    store, client = new_store(rendezvous)
    pending = asyncio.ensure_future(blocking(store.multi_get, ["x", "y"]))
    await asyncio.sleep(0.2)
    rendezvous.store.set("y", b"Y")
    await asyncio.sleep(0.1)
    assert not pending.done()
    rendezvous.store.set("x", b"X")
    assert await asyncio.wait_for(pending, 5) == [b"X", b"Y"]
    assert client.requests == {"multi_get": 1}


async def test_wait_get_and_multi_get_time_out(rendezvous: RoundsServer) -> None:
    store, _ = new_store(rendezvous, timeout=0.3)
    for call, args in ((store.get, ("missing",)), (store.multi_get, (["missing"],)),
                       (store.wait, (["missing"], datetime.timedelta(seconds=0.2)))):
        started = time.monotonic()
        with pytest.raises(dist.DistStoreError, match="timed out"):
            await blocking(call, *args)
        assert time.monotonic() - started < 3


async def test_extended_api_append_multi_set_compare_set(rendezvous: RoundsServer) -> None:
    store, _ = new_store(rendezvous)
    assert store.has_extended_api()
    prefixed: Any = dist.PrefixStore("p/", store)  # torch's stubs lack these methods
    assert prefixed.has_extended_api()
    await blocking(prefixed.append, "log", b"ab")
    await blocking(prefixed.append, "log", b"cd")
    await blocking(prefixed.multi_set, ["m1", "m2"], [b"1", b"2"])
    assert await blocking(prefixed.multi_get, ["log", "m2", "m1"]) == [b"abcd", b"2", b"1"]
    assert await blocking(prefixed.compare_set, "m1", b"1", b"one") == b"one"


async def test_gloo_group_built_through_the_store_makes_one_request_per_peer(
        rendezvous: RoundsServer) -> None:
    """torch's Gloo sets its address, then waits for and gets every rank's (its own too)."""
    size = 3
    stores = [new_store(rendezvous) for _ in range(size)]

    def build(rank: int) -> float:
        store = dist.PrefixStore("group/", stores[rank][0])
        group: Any = dist.ProcessGroupGloo(store, rank, size, datetime.timedelta(seconds=20))
        tensor = torch.ones(1)
        group.allreduce([tensor]).wait()
        return float(tensor.item())

    results = await asyncio.gather(*(blocking(build, rank) for rank in range(size)))
    assert results == [float(size)] * size
    for _, client in stores:
        assert client.requests == {"set": 1, "multi_get": size}


async def test_gloo_group_built_in_full_mesh_asks_at_most_once_per_peer(
        rendezvous: RoundsServer) -> None:
    """Inside full_mesh(size), ranks arriving in two waves build a working group; a rank's
    own address costs no request, and no peer's costs more than one."""
    size = 4
    stores = [new_store(rendezvous) for _ in range(size)]

    def build(rank: int) -> float:
        if rank >= 2:
            time.sleep(0.5)  # the second wave
        store, _ = stores[rank]
        with store.full_mesh(size):
            group: Any = dist.ProcessGroupGloo(dist.PrefixStore("mesh/", store), rank, size,
                                               datetime.timedelta(seconds=20))
        tensor = torch.ones(1)
        group.allreduce([tensor]).wait()
        return float(tensor.item())

    results = await asyncio.gather(*(blocking(build, rank) for rank in range(size)))
    assert results == [float(size)] * size
    requests = [client.requests for _, client in stores]
    # the own address rides along with the first fetch
    assert all(r["set"] == 0 and 1 <= r["multi_get"] <= size - 1 for r in requests), requests


async def test_full_mesh_fetches_every_address_that_exists_with_the_one_waited_for(
        rendezvous: RoundsServer) -> None:
    store, client = new_store(rendezvous)
    for rank in (0, 1, 2):
        rendezvous.store.set(f"g/{rank}", f"address {rank}".encode())

    def connect() -> list[bytes]:
        with store.full_mesh(4):
            store.wait(["g/1"])  # fetches 0, 1 and 2: one request
            first = [store.get(f"g/{rank}") for rank in (0, 1, 2)]  # no request
            store.wait(["g/3"])  # the latecomer: one more request, long-polled
            return [*first, store.get("g/3")]

    pending = asyncio.ensure_future(blocking(connect))
    await asyncio.sleep(0.3)
    assert not pending.done() and client.requests == {"multi_get": 2}
    rendezvous.store.set("g/3", b"address 3")
    assert await asyncio.wait_for(pending, 5) == [f"address {r}".encode() for r in range(4)]
    assert client.requests == {"multi_get": 2}


async def test_an_address_not_carried_by_a_fetch_is_sent_before_anything_else(
        rendezvous: RoundsServer) -> None:
    """A group of one never fetches: leaving full_mesh() sends its address. Any other
    request sends it first."""
    store, client = new_store(rendezvous)

    def alone() -> None:
        with store.full_mesh(1):
            store.set("solo/0", b"me")
            assert store.get("solo/0") == b"me"  # its own: no request

    await blocking(alone)
    assert client.requests == {"set": 1} and rendezvous.store.get("solo/0") == b"me"

    def then_other() -> int:
        with store.full_mesh(2):
            store.set("duo/1", b"one")
            return store.add("counter", 1)

    assert await blocking(then_other) == 1
    assert rendezvous.store.get("duo/1") == b"one"
    assert client.requests == {"set": 2, "add": 1}


async def test_full_mesh_leaves_other_keys_to_the_usual_path(rendezvous: RoundsServer) -> None:
    store, client = new_store(rendezvous)
    rendezvous.store.set("p/7", b"seven")  # not a rank of a 2-rank mesh
    rendezvous.store.set("p/x", b"x")

    def inside() -> tuple[bytes, bytes]:
        with store.full_mesh(2):
            store.wait(["p/7"])
            seven = store.get("p/7")
            return seven, store.get("p/x")

    assert await blocking(inside) == (b"seven", b"x")
    assert client.requests == {"multi_get": 2}  # a wait + get pair, then a get


async def test_full_mesh_wait_times_out(rendezvous: RoundsServer) -> None:
    store, _ = new_store(rendezvous, timeout=0.3)

    def wait_for_an_absent_rank() -> None:
        with store.full_mesh(3):
            store.wait(["g/1"], datetime.timedelta(seconds=0.3))

    started = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="timed out"):
        await blocking(wait_for_an_absent_rank)
    assert time.monotonic() - started < 3


async def test_a_carried_set_passes_the_same_gate_as_a_set(rendezvous: RoundsServer) -> None:
    """A fetch may not smuggle a set of a round the asker is not a member of."""
    store, _ = new_store(rendezvous)
    foreign = protocol.round_prefix(5) + "0"

    def smuggle() -> None:
        store._kv("multi_get", keys=["x"], partial=True, timeout=0,
                  set_key=foreign, set_value="AA==")

    with pytest.raises(RequestRefusedError, match="403"):
        await blocking(smuggle)
    assert rendezvous.store.get(foreign) is None
