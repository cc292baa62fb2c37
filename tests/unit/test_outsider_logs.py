"""Outsiders cannot write the driver's log: against the real operator routes and agent hub on
127.0.0.1, 200 host-change webhook calls with a wrong or missing token, 50 agent connections
signed with another token and 20 malformed HTTP requests are each counted, leave at most a
couple of lines per kind and no traceback; and a wrong token is refused before its body is
read."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from elasticrun import protocol
from elasticrun.discovery.base import HostSlots
from elasticrun.driver.operate.routes import OperatorRoutes
from elasticrun.launch.agents import wire
from elasticrun.launch.agents.hub import AgentHub
from elasticrun.system.outsiders import Outsiders, quiet_aiohttp, refusal_counter

pytestmark = pytest.mark.timeout(30)

WEBHOOK_TOKEN = "webhook-token-0123456789abcdef"
AGENT_TOKEN = "agent-token-" + "x" * 20
MALFORMED = b"GET /status HTTP/1.1\r\nHost: driver\r\nno colon in this header\r\n\r\n"


class NoTarget:
    def status(self) -> dict[str, Any]:
        return {}

    def metrics(self) -> bytes:
        return b""

    def hosts_view(self) -> dict[str, Any]:
        return {}

    def push_hosts(self, action: str, hosts: HostSlots) -> dict[str, Any]:
        raise AssertionError("an outsider changed the hosts")


@dataclass
class Driverish:
    url: str
    port: int
    outsiders: Outsiders
    registry: CollectorRegistry

    def refused(self, kind: str) -> float | None:
        return self.registry.get_sample_value("elasticrun_refused_requests_total",
                                              {"kind": kind})


@contextlib.asynccontextmanager
async def serving(per_server_logger: bool) -> AsyncIterator[Driverish]:
    """The operator routes and the agent hub, sharing one Outsiders as in the driver;
    aiohttp's lines for malformed requests go to it through the server's own logger, or
    (`per_server_logger` False) through the quiet_aiohttp filter."""
    registry = CollectorRegistry()
    outsiders = Outsiders(refusal_counter(registry))
    routes = OperatorRoutes(NoTarget(), WEBHOOK_TOKEN, default_slots=1)
    routes.outsiders = outsiders
    hub = AgentHub(AGENT_TOKEN)
    hub.outsiders = outsiders
    app = web.Application()
    app.add_routes(routes.routes() + hub.routes())
    if per_server_logger:
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5,
                               logger=outsiders.http_logger())
    else:
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = int(runner.addresses[0][1])
        yield Driverish(f"http://127.0.0.1:{port}", port, outsiders, registry)
    finally:
        await runner.cleanup()
        outsiders.flush()


async def raw(port: int, request: bytes, body: bytes = b"") -> bytes:
    """Sends `request` (and `body`, not necessarily all its Content-Length) and returns the
    status line of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request + body)
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), 5)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


def per_kind(records: list[logging.LogRecord], words: str) -> list[str]:
    return [r.getMessage() for r in records if words in r.getMessage()]


async def outsiders_knock(driver: Driverish, session: aiohttp.ClientSession) -> None:
    for n in range(200):
        headers = {} if n % 2 else {"Authorization": f"Bearer wrong-{n}"}
        async with session.put(driver.url + "/v1/hosts", json={"hosts": {"evil": 1}},
                               headers=headers) as response:
            assert response.status == 401
    for _ in range(50):
        signed = protocol.sign_headers("another-token-" + "y" * 20, "GET", wire.PATH, b"")
        async with session.get(driver.url + wire.PATH, headers=signed) as response:
            assert response.status == 401
    for _ in range(20):
        assert (await raw(driver.port, MALFORMED)).split()[1] == b"400"


async def test_outsiders_are_counted_and_leave_a_couple_of_lines_per_kind(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        async with serving(per_server_logger=True) as driver, aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=10)) as session:
            await outsiders_knock(driver, session)
            assert (driver.refused("wrong_webhook_token"), driver.refused("wrong_agent_token"),
                    driver.refused("malformed_http")) == (200, 50, 20)
    records = warnings(caplog)
    assert not [r for r in records if r.exc_info or "Traceback" in r.getMessage()]
    webhook = per_kind(records, "host-change webhook request")
    agents = per_kind(records, "agent connection")
    malformed = per_kind(records, "malformed HTTP")
    assert 1 <= len(webhook) <= 2 and 1 <= len(agents) <= 2 and 1 <= len(malformed) <= 2, \
        [r.getMessage() for r in records]
    assert len(records) <= 6, [r.getMessage() for r in records]
    # the held-back ones are said at the end (the driver's telemetry closes its Outsiders)
    assert webhook[-1].startswith("refused 199 host-change webhook requests from 127.0.0.1 "
                                  "in the last ")
    assert agents[0].startswith("refused an agent connection from 127.0.0.1: bad signature")
    assert agents[-1].startswith("refused 49 agent connections from 127.0.0.1")


@contextlib.contextmanager
def aiohttp_filters_kept() -> Iterator[None]:
    logger = logging.getLogger("aiohttp.server")
    before = list(logger.filters)
    yield
    assert logger.filters == before


async def test_quiet_aiohttp_counts_the_malformed_requests_of_a_plain_server(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO), aiohttp_filters_kept():
        async with serving(per_server_logger=False) as driver:
            with quiet_aiohttp(driver.outsiders):
                for _ in range(10):
                    assert (await raw(driver.port, MALFORMED)).split()[1] == b"400"
            assert driver.refused("malformed_http") == 10
    records = warnings(caplog)
    assert not [r for r in records if r.name.startswith("aiohttp") or r.exc_info]
    assert 1 <= len(per_kind(records, "malformed HTTP")) <= 2


@pytest.mark.parametrize("head", [
    b"PUT /v1/hosts HTTP/1.1\r\nHost: driver\r\nAuthorization: Bearer wrong\r\n",
    b"POST /v1/hosts/add HTTP/1.1\r\nHost: driver\r\n",
    b"GET " + wire.PATH.encode() + b" HTTP/1.1\r\nHost: driver\r\n",
])
async def test_a_wrong_token_is_refused_before_the_body_arrives(head: bytes) -> None:
    """100 MB announced, 1 KB sent: the 401 comes anyway (the body was never waited for)."""
    async with serving(per_server_logger=True) as driver:
        status = await raw(driver.port, head + b"Content-Length: 104857600\r\n\r\n",
                           b"{" * 1024)
    assert status.startswith(b"HTTP/1.1 401"), status
