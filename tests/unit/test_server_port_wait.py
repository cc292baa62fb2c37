"""A resumed driver binds the port its predecessor held, which the kernel frees a moment
after the predecessor is gone: the server tries the port again for a bounded time."""

from __future__ import annotations

import asyncio
import random
import socket

import pytest

from elasticrun.driver.hosts.registry import HostRegistry
from elasticrun.driver.rounds.state import JobState
from elasticrun.driver.server.app import WorkerServer


def held_port() -> socket.socket:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


def server() -> WorkerServer:
    return WorkerServer("s" * 32, JobState(HostRegistry(None, random.Random(0))),
                        lambda event: None)


async def test_a_port_freed_meanwhile_is_taken() -> None:
    holder = held_port()
    port = holder.getsockname()[1]
    asyncio.get_running_loop().call_later(0.3, holder.close)
    worker_server = server()
    try:
        assert await worker_server.start("127.0.0.1", port, port_wait_s=5.0) == port
    finally:
        await worker_server.stop()


async def test_without_the_wait_a_port_in_use_is_an_error_at_once() -> None:
    holder = held_port()
    worker_server = server()
    try:
        with pytest.raises(OSError):
            await worker_server.start("127.0.0.1", holder.getsockname()[1])
    finally:
        holder.close()
        await worker_server.stop()
