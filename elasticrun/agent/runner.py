"""The agent's life: connect out to the driver, say hello, run what it says, and go.

- It registers its host and slots; the driver starts and stops its workers through it.
- The driver silent for longer than the grace (its process gone, its node gone, or it
  stopped answering): the agent stops its workers and exits 1. Within the grace it
  reconnects (a new connection takes over the running workers) and nothing is lost.
- SIGTERM (pod eviction, Slurm preemption): a drain. The driver lets its workers leave at
  the next commit; once they have, the agent says bye and exits 0. A second SIGTERM or
  SIGINT stops them at once.
- The job's end (the driver says so): it stops what is left and exits 0 (or, with
  `exit_with_job`, as torchrun does on every node: 0 when the job succeeded, else non-zero).
- Its first connection may wait for a driver that starts later (torchrun's form starts
  the same line on every node at once): it keeps trying for `first_contact_timeout`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from elasticrun.agent.contact import DriverContact, DriverGone, Refused
from elasticrun.agent.outbox import Outbox
from elasticrun.agent.workers import AgentWorkers
from elasticrun.launch.agents import wire
from elasticrun.system.loop_signals import handling
from elasticrun.system.timed import within

log = logging.getLogger("elasticrun.agent")

HEARTBEAT_S = 2.0  # pings to the driver; its silence is measured against the grace
RETRY_S = (0.1, 0.2, 0.5, 1.0)  # between connection attempts
CONNECT_TIMEOUT_S = 10.0  # one attempt: TCP, the upgrade, hello and welcome
REFUSED_EXIT = 2  # the driver refused this agent: the job, if it runs, runs without it


@dataclass(frozen=True)
class AgentSettings:
    driver: str  # http://host:port
    token: str
    host: str
    slots: int
    driver_grace: float = 300.0
    stop_grace: float = 5.0
    drain_timeout: float = 600.0
    working_dir: Path | None = None
    ready_file: Path | None = None  # exists while connected (a Kubernetes readiness probe)
    # How long the first connection keeps being tried (None: driver_grace); later ones,
    # after a loss, are bounded by driver_grace.
    first_contact_timeout: float | None = None
    exit_with_job: bool = False  # exit with the job's result rather than 0 at its end
    # What a refusal of this agent's token suggests checking.
    token_hint: str = "is --token-file the job's agent token?"


class Agent:
    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self._id = secrets.token_hex(8)
        self._outbox = Outbox()
        self._workers = AgentWorkers(settings.token, settings.working_dir, self._outbox.put)
        self._contact = DriverContact(settings.driver, settings.token, settings.token_hint,
                                      settings.driver_grace, settings.first_contact_timeout)
        self._draining = False
        self._ending: asyncio.Task[None] | None = None  # the job is over: its workers stop
        self._result: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    # --- the whole life -----------------------------------------------------------------------
    async def run(self) -> int:
        signals = {sig: (self._signalled, (sig,)) for sig in (signal.SIGTERM, signal.SIGINT)}
        with handling(asyncio.get_running_loop(), signals):
            return await self._live()

    async def _live(self) -> int:
        try:
            async with aiohttp.ClientSession() as session:
                life = asyncio.ensure_future(self._connect_loop(session))
                life.add_done_callback(self._life_ended)
                await asyncio.wait({self._result})
                life.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await life
                return await self._result
        except Refused as exc:
            log.error("the driver at %s refused this agent: %s", self.settings.driver, exc)
            await self._workers.stop_all(self.settings.stop_grace)
            return REFUSED_EXIT
        except DriverGone:
            count = len(self._workers)
            if self._contact.welcomed:
                log.error("the driver at %s has not answered for %gs: stopping %d worker(s)",
                          self.settings.driver, self.settings.driver_grace, count)
            else:
                log.error("could not reach the driver at %s within %gs", self.settings.driver,
                          self._contact.patience())
            await self._workers.stop_all(self.settings.stop_grace)
            return 1
        finally:
            self._set_ready(False)

    def _set_ready(self, ready: bool) -> None:
        path = self.settings.ready_file
        if path is None:
            return
        with contextlib.suppress(OSError):
            if ready:
                path.write_text(f"{self.settings.driver}\n")
            else:
                path.unlink(missing_ok=True)

    def _life_ended(self, life: asyncio.Future[None]) -> None:
        """The connection loop ends only by raising (Refused, DriverGone, a bug)."""
        if not self._result.done() and not life.cancelled():
            error = life.exception()
            self._result.set_exception(error if error is not None else RuntimeError(
                "the agent's connection loop ended"))

    def _finish(self, code: int) -> None:
        if not self._result.done():
            self._result.set_result(code)

    def _signalled(self, sig: signal.Signals) -> None:
        if self._draining:
            log.info("%s again: stopping %d worker(s) now", sig.name, len(self._workers))
            asyncio.get_running_loop().create_task(self._stop_and_finish(128 + sig.value))
            return
        self._draining = True
        log.info("%s: draining (the workers leave at the job's next commit)", sig.name)
        self._outbox.put(wire.Drain())
        self._workers.changed.set()
        asyncio.get_running_loop().call_later(self.settings.drain_timeout, self._drain_expired)

    def _drain_expired(self) -> None:
        if self._result.done():
            return
        log.error("the workers did not leave within --drain-timeout %gs: stopping %d",
                  self.settings.drain_timeout, len(self._workers))
        asyncio.get_running_loop().create_task(self._stop_and_finish(1))

    async def _stop_and_finish(self, code: int, job_over: bool = False) -> None:
        await self._workers.stop_all(self.settings.stop_grace)
        if job_over:  # the snapshots of its commits kept on this host are of no more use
            for directory in self._workers.snapshot_dirs:
                shutil.rmtree(directory, ignore_errors=True)
        self._finish(code)

    # --- connections -------------------------------------------------------------------------
    async def _connect_loop(self, session: aiohttp.ClientSession) -> None:
        attempt = 0
        while True:
            try:
                ws = await within(self._connect(session), CONNECT_TIMEOUT_S)
            except (TimeoutError, aiohttp.ClientError, OSError, wire.BadMessage) as exc:
                self._contact.check_grace(f"cannot reach it: {exc}")
                await asyncio.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)])
                attempt += 1
                continue
            attempt = 0
            async with ws:
                await self._session(ws)
            self._set_ready(False)
            if self._drained():
                self._finish(0)  # the driver hung up after the bye
                return
            if self._ending is not None:  # the driver hung up after the job's end
                await asyncio.shield(self._result)
                return
            log.warning("the connection to the driver closed; reconnecting (for up to %gs)",
                        self.settings.driver_grace)
            self._contact.check_grace("its connection closed")

    async def _connect(self, session: aiohttp.ClientSession
                       ) -> aiohttp.ClientWebSocketResponse:
        ws, welcome = await self._contact.connect(session, self._hello)
        self._set_ready(True)
        log.info("connected to the driver at %s (job %s) as host %s with %d slot(s)",
                 self.settings.driver, welcome.job, self.settings.host, self.settings.slots)
        for worker in welcome.stop:
            self._workers.stop(worker, self.settings.stop_grace)
        return ws

    def _hello(self) -> wire.Hello:
        # Workers that ended while the driver was away count too: their exits are queued.
        known = self._workers.ids() + self._outbox.exited()
        return wire.Hello(
            self.settings.host, self.settings.slots, self._id, tuple(known), self._draining)

    async def _session(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """One connection: messages in, messages out, pings, drain progress. Returns when
        the connection breaks; raises DriverGone."""
        tasks = [asyncio.ensure_future(coro) for coro in (
            self._receive(ws), self._outbox.send_all(ws), self._ping(ws), self._watch_drain(ws))]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                error = task.exception()
                if isinstance(error, DriverGone):
                    raise error
                if error is not None:
                    log.debug("connection to the driver broke: %r", error)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)

    async def _receive(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        while True:
            message = await ws.receive()
            self._contact.heard()
            if message.type == aiohttp.WSMsgType.PING:
                await ws.pong(message.data)
                continue
            if message.type == aiohttp.WSMsgType.PONG:
                continue
            if message.type != aiohttp.WSMsgType.TEXT:
                return  # closed or broken
            try:
                await self._handle(wire.decode(message.data))
            except wire.BadMessage as exc:
                log.warning("bad message from the driver: %s", exc)

    async def _handle(self, message: wire.Message) -> None:
        if isinstance(message, wire.Start):
            if self._draining:
                self._outbox.put(wire.StartFailed(message.worker, "the agent is draining"))
            else:
                self._workers.begin(message)
        elif isinstance(message, wire.Stop):
            self._workers.stop(message.worker, message.grace)
        elif isinstance(message, wire.Inspect):
            view = await self._workers.inspect(message.worker)
            self._outbox.put(wire.Inspected(message.worker, view.state.value, view.detail))
        elif isinstance(message, wire.End) and not self._ending:
            if message.code != 0 and message.reason:
                log.error("the job failed: %s", message.reason)
            log.info("the job is over (exit code %d): stopping %d worker(s)", message.code,
                     len(self._workers))
            # Not awaited here: the driver hangs up meanwhile, and the end of this connection
            # must not cut the stop short (and leave the agent reconnecting to no driver).
            self._ending = asyncio.get_running_loop().create_task(
                self._stop_and_finish(self._end_code(message.code), job_over=True))

    def _end_code(self, job_code: int) -> int:
        """The agent's exit code at the job's end (the job's own code: 0 success, 1
        failure, 128+N a signal)."""
        if not self.settings.exit_with_job or job_code == 0:
            return 0
        return job_code if 0 < job_code < 256 else 1

    async def _ping(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            if self._contact.silent_for() > self.settings.driver_grace:
                raise DriverGone
            await ws.ping()

    async def _watch_drain(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """A draining agent says bye and exits 0 once its workers have left."""
        while not self._drained():
            await self._workers.changed.wait()
            self._workers.changed.clear()
        self._outbox.put(wire.Bye())
        with contextlib.suppress(Exception):
            await within(self._outbox.flushed(), 2.0)
        log.info("drained: every worker has left")
        self._finish(0)

    def _drained(self) -> bool:
        return self._draining and len(self._workers) == 0
