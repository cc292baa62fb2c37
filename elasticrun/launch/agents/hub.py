"""The driver's side of `elasticrun agent`s: their WebSocket endpoint, and who is connected.

An agent connects out to the driver, signs its upgrade request with the job's agent token
and says hello (host, slots). From then on it is a host with slots (the hub is the
`--discovery agents` source) and the place its workers run (the `agent` launcher). An agent
whose connection closes, or that misses its heartbeats (a lost node), is gone: its workers
are reported exited with 255, as a lost SSH connection is, so its host counts as failed.
An agent that says `drain` (it got SIGTERM) has its host drained: its workers leave at the
next commit, and it says `bye` once they have.

A reconnect (the same agent id, e.g. after a network blip the driver never noticed) takes
over its workers; so does a resumed driver's hub, for the workers its journal kept there
(`adopt`); workers the driver does not know are named in the welcome to be stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import WSMsgType, web

from elasticrun import protocol
from elasticrun.discovery.base import HostSlots
from elasticrun.launch.agents import wire
from elasticrun.launch.agents.process import AgentProcess
from elasticrun.system.outsiders import Outsiders, agent_kind
from elasticrun.system.timed import within

log = logging.getLogger("elasticrun.agents")

HEARTBEAT_S = 5.0  # a silent agent is gone after about 1.5x this (aiohttp's pong wait)
HELLO_TIMEOUT_S = 10.0
END_WAIT_S = 5.0  # at the job's end, how long agents get to hang up
MAX_REASON = 4000  # characters of the job's failure that agents are told


@dataclass(eq=False)
class AgentLink:
    """One connected agent."""

    hello: wire.Hello
    ws: web.WebSocketResponse
    remote: str  # the agent's address, as the driver sees it
    local: str  # the driver's address the agent dialed: its workers dial it too
    processes: dict[str, AgentProcess] = field(default_factory=dict)
    draining: bool = False
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # its connection is over

    @property
    def host(self) -> str:
        return self.hello.host

    async def send(self, message: wire.Message) -> None:
        """Sends one message; a closed connection is the reader's to notice."""
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.ws.send_str(wire.encode(message))


class AgentHub:
    def __init__(self, token: str, own: bool = False) -> None:
        """`own`: the agents are the job's own (launch/local/agents.py), not the user's:
        their comings and goings are logged at debug level."""
        self.token = token
        self._level = logging.DEBUG if own else logging.INFO
        self.job_id = ""  # the driver's, for the agents' logs
        self._guard = protocol.SignatureGuard(token)
        # refused connections are counted and logged here: the driver gives its own
        self.outsiders = Outsiders()
        self._links: dict[str, AgentLink] = {}
        self._closing = False
        self._joined = asyncio.Event()  # set (and replaced) whenever an agent joins
        self.on_change: Callable[[], None] = lambda: None  # hosts came or went
        self.on_drain: Callable[[str], None] = lambda host: None
        # A resumed driver's: whether it takes back a worker an agent says it runs but this
        # hub never started (host, worker id, the process as seen from here).
        self.adopt: Callable[[str, str, AgentProcess], bool] = lambda host, worker, p: False

    def routes(self) -> list[web.RouteDef]:
        return [web.get(wire.PATH, self._serve)]

    def hosts(self) -> HostSlots:
        """The connected agents' hosts and slots, in the order they came."""
        return {host: link.hello.slots for host, link in self._links.items()}

    def link(self, host: str) -> AgentLink | None:
        return self._links.get(host)

    async def wait_for(self, host: str, timeout: float) -> AgentLink | None:
        """The agent of `host`, waiting up to `timeout` for it to connect (hosts may come
        from another source than the agents, e.g. Slurm, and be listed before their agents
        are up)."""
        deadline = time.monotonic() + timeout
        while (link := self._links.get(host)) is None and not self._closing:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            with contextlib.suppress(asyncio.TimeoutError):
                await within(self._joined.wait(), left)
        return link

    async def close(self, code: int, reason: str = "") -> None:
        """The job is over: every agent is told so (and why it failed, if it did), and gets
        a moment to hang up."""
        self._closing = True
        self.outsiders.flush()
        links = list(self._links.values())
        end = wire.End(code, reason[:MAX_REASON])
        await asyncio.gather(*(link.send(end) for link in links))
        waits = [asyncio.ensure_future(link.ended.wait()) for link in links]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=END_WAIT_S)
            for wait in pending:
                wait.cancel()
        for link in links:
            with contextlib.suppress(Exception):
                await within(link.ws.close(), 1.0)

    # --- one agent's connection ---------------------------------------------------------------
    async def _serve(self, request: web.Request) -> web.StreamResponse:
        # The upgrade is a GET: a body an outsider sends with it is never read.
        reason = self._guard.check(request.method, request.path_qs, b"", request.headers,
                                   time.time())
        if reason is not None:
            self.outsiders.refused(agent_kind(reason), request.remote)
            return _refusal(401, f"agent token: {reason}")
        if self._closing:
            return _refusal(503, "the job is ending")
        ws = web.WebSocketResponse(heartbeat=HEARTBEAT_S, max_msg_size=wire.MAX_MESSAGE_BYTES)
        await ws.prepare(request)
        link = await self._greet(request, ws)
        if link is None:
            await ws.close()
            return ws
        try:
            async for message in ws:
                if message.type != WSMsgType.TEXT:
                    break
                try:
                    await self._handle(link, wire.decode(message.data))
                except wire.BadMessage as exc:
                    log.warning("agent %s sent a bad message: %s", link.host, exc)
        finally:
            self._gone(link)
            link.ended.set()
        return ws

    async def _greet(self, request: web.Request, ws: web.WebSocketResponse
                     ) -> AgentLink | None:
        try:
            first = await within(ws.receive(), HELLO_TIMEOUT_S)
            hello = wire.decode(first.data) if first.type == WSMsgType.TEXT else None
        except (TimeoutError, wire.BadMessage) as exc:
            log.warning("agent connection from %s: no valid hello (%s)", request.remote,
                        exc or "timed out")
            return None
        if not isinstance(hello, wire.Hello):
            return None
        old = self._links.get(hello.host)
        if old is not None and old.hello.agent != hello.agent:
            await ws.send_str(wire.encode(wire.Refused(
                f"host {hello.host} already has an agent (from {old.remote}); give each "
                f"agent its own --host")))
            return None
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        link = AgentLink(hello, ws, request.remote or "?",
                         str(sockname[0]) if sockname else "127.0.0.1")
        unknown = self._take_over(old, link)
        self._links[hello.host] = link
        self._joined.set()
        self._joined = asyncio.Event()
        if hello.draining:
            self._drain(link)  # before the host is seen: nothing starts there any more
        await link.send(wire.Welcome(self.job_id, tuple(unknown)))
        if old is not None:
            log.log(self._level, "agent for host %s reconnected from %s", hello.host,
                    link.remote)
            with contextlib.suppress(Exception):
                await within(old.ws.close(), 1.0)
        else:
            log.log(self._level, "agent joined: host %s with %d slot(s), from %s", hello.host,
                    hello.slots, link.remote)
            self.on_change()
        return link

    def _take_over(self, old: AgentLink | None, link: AgentLink) -> list[str]:
        """Moves a reconnecting agent's workers to its new link, and offers the others to
        `adopt` (a resumed driver's agents come back to a hub that never knew them);
        returns the ones nobody takes (they are to be stopped)."""
        still_running = set(link.hello.workers)
        if old is not None:
            for worker, process in old.processes.items():
                if worker in still_running:
                    process.relink(link.send)
                    link.processes[worker] = process
                else:
                    process.lost()  # it ended while the agent was away: its exit is unknown
            old.processes.clear()
        unknown = []
        for worker in link.hello.workers:
            if worker in link.processes:
                continue
            process = AgentProcess(worker, link.send)
            process.heard(wire.Started(worker, 0))
            if self.adopt(link.host, worker, process):
                link.processes[worker] = process
            else:
                unknown.append(worker)
        return unknown

    async def _handle(self, link: AgentLink, message: wire.Message) -> None:
        if isinstance(message, (wire.Started, wire.StartFailed, wire.Output, wire.Exited,
                                wire.Inspected)):
            process = link.processes.get(message.worker)
            if process is None:
                return
            process.heard(message)
            if isinstance(message, (wire.Exited, wire.StartFailed)):
                del link.processes[message.worker]
        elif isinstance(message, wire.Drain):
            self._drain(link)
        elif isinstance(message, wire.Bye):
            log.info("agent for host %s left", link.host)
            await link.ws.close()

    def _drain(self, link: AgentLink) -> None:
        if not link.draining:
            link.draining = True
            log.info("agent for host %s is draining (it got SIGTERM): its workers leave at "
                     "the next commit", link.host)
            self.on_drain(link.host)

    def _gone(self, link: AgentLink) -> None:
        if self._links.get(link.host) is not link:
            return  # replaced by a reconnect, which took its workers
        del self._links[link.host]
        for process in link.processes.values():
            process.lost()
        if link.processes and not self._closing:
            silent = isinstance(link.ws.exception(), asyncio.TimeoutError)
            log.warning("agent for host %s is gone (%s) with %d worker(s)", link.host,
                        "its heartbeats stopped" if silent else "its connection closed",
                        len(link.processes))
        link.processes.clear()
        if not self._closing:
            self.on_change()


def _refusal(status: int, reason: str) -> web.Response:
    """The reason rides in a header too: a WebSocket client sees headers, not bodies."""
    return web.json_response({"error": reason}, status=status,
                             headers={wire.REFUSED_HEADER: reason})
