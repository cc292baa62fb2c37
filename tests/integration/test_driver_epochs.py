"""Fencing by driver epoch, over real HTTP: every answer of the driver's server carries its
epoch, and a worker's client never obeys a driver older than one it has heard (a stopped
driver that wakes up after a resumed one took over); its requests name that epoch, so the
older driver does nothing they ask and learns that it was superseded."""

from __future__ import annotations

import asyncio
import base64

import pytest

from elasticrun import protocol
from elasticrun.driver.rounds.assignment import SlotId
from elasticrun.worker.client import DriverClient, DriverUnreachableError
from tests.rounds_server import RoundsServer

SECRET = protocol.new_secret()
SET = protocol.PATH_KV_PREFIX + "set"
pytestmark = pytest.mark.timeout(60)


def store_call(client: DriverClient, value: bytes) -> dict[str, object]:
    return client.call(SET, {"worker": "tester", "key": "k",
                             "value": base64.b64encode(value).decode()})


async def serving(epoch: int, port: int = 0) -> RoundsServer:
    server = RoundsServer(SECRET, epoch=epoch)
    server.add_worker("tester", SlotId("tester-host", 0))  # a registered worker
    await server.start(port=port)
    return server


async def test_a_worker_never_obeys_a_driver_older_than_one_it_heard() -> None:
    resumed = await serving(epoch=2)
    port = resumed.port
    client = DriverClient("127.0.0.1", port, SECRET, unreachable_timeout=1.5)
    try:
        await asyncio.to_thread(store_call, client, b"from 2")
        assert client.epoch == 2 and resumed.store.get("k") == b"from 2"
        await resumed.stop()
        stale = await serving(epoch=1, port=port)  # the old driver, woken up on its port
        try:
            with pytest.raises(DriverUnreachableError) as refused:
                await asyncio.to_thread(store_call, client, b"from 1")
            assert "older driver answered (epoch 1; this worker has heard epoch 2)" in \
                str(refused.value)
            assert client.epoch == 2
            # The stale driver did nothing the request asked, and learnt it was superseded.
            assert stale.store.get("k") is None and stale.superseded_by[0] == 2
        finally:
            await stale.stop()
        newer = await serving(epoch=3, port=port)
        try:
            await asyncio.to_thread(store_call, client, b"from 3")
            assert client.epoch == 3 and newer.store.get("k") == b"from 3"
        finally:
            await newer.stop()
    finally:
        client.close()
