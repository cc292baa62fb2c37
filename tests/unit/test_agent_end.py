"""An agent's ends, against a real AgentHub (the driver's side) in this process: the job's
result as its exit code (torchrun's form: every node exits as the job did), a refused token
said in one line with its hint, and a first connection that waits for a late driver."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from elasticrun.agent.runner import Agent, AgentSettings
from elasticrun.launch.agents.hub import AgentHub

TOKEN = "agent-token-" + "x" * 20


@pytest.fixture
async def hub_url() -> AsyncIterator[tuple[AgentHub, str]]:
    hub = AgentHub(TOKEN)
    app = web.Application()
    app.add_routes(hub.routes())
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield hub, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def settings(url: str, **more: object) -> AgentSettings:
    return AgentSettings(driver=url, token=str(more.pop("token", TOKEN)), host="node-a",
                         slots=1, **more)  # type: ignore[arg-type]


async def joined(hub: AgentHub, agent: asyncio.Task[int]) -> None:
    for _ in range(200):
        if "node-a" in hub.hosts():
            return
        assert not agent.done(), agent.result()
        await asyncio.sleep(0.02)
    raise AssertionError("the agent never joined")


async def agent_exit(hub: AgentHub, url: str, job_code: int, exit_with_job: bool) -> int:
    agent = asyncio.ensure_future(Agent(settings(url, exit_with_job=exit_with_job)).run())
    await joined(hub, agent)
    await hub.close(job_code)
    return await asyncio.wait_for(agent, 10)


@pytest.mark.parametrize(("job_code", "exit_with_job", "expected"), [
    (0, True, 0), (1, True, 1), (143, True, 143), (300, True, 1),
    (0, False, 0), (1, False, 0)])
async def test_the_agent_exits_with_the_job(hub_url: tuple[AgentHub, str], job_code: int,
                                            exit_with_job: bool, expected: int) -> None:
    hub, url = hub_url
    assert await agent_exit(hub, url, job_code, exit_with_job) == expected


async def test_a_refused_token_says_what_to_check(hub_url: tuple[AgentHub, str],
                                                  caplog: pytest.LogCaptureFixture) -> None:
    _, url = hub_url
    agent = Agent(settings(url, token="another-token-" + "y" * 20,
                           token_hint="do all nodes give the same --rdzv-id?"))
    with caplog.at_level(logging.ERROR, logger="elasticrun.agent"):
        assert await asyncio.wait_for(agent.run(), 10) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("refused this agent" in e and "same --rdzv-id?" in e for e in errors), errors


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_the_first_contact_waits_longer_than_the_grace() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    assert await Agent(settings(url, driver_grace=0.2)).run() == 1
    quick = time.monotonic() - started
    started = time.monotonic()
    assert await Agent(settings(url, driver_grace=0.2, first_contact_timeout=1.5)).run() == 1
    patient = time.monotonic() - started
    assert quick < 1.2 and patient >= 1.5
