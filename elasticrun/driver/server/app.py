"""The driver's HTTP server (aiohttp): its lifecycle, and the routes it serves.

Worker routes (signed with the job secret: signing.py) are the round endpoints
(rounds_api.py) and the store (kv.py); operator routes bring their own auth. The server
serves only: every decision is the round machine's, whose state it reads.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import time
from collections.abc import Callable, Iterable, Sequence

from aiohttp import web

from elasticrun import protocol
from elasticrun.driver.operate.flash_cadence import FlashCadences
from elasticrun.driver.operate.timeline import JobTimeline
from elasticrun.driver.rounds import events as ev
from elasticrun.driver.rounds.state import JobState
from elasticrun.driver.server.connections import GuardedRunner
from elasticrun.driver.server.flash_api import FlashEndpoint
from elasticrun.driver.server.gc_policy import pace_for_serving
from elasticrun.driver.server.kv import KVEndpoints
from elasticrun.driver.server.results_api import ResultEndpoints
from elasticrun.driver.server.rounds_api import RoundEndpoints
from elasticrun.driver.server.signing import RequestSigning
from elasticrun.driver.server.timeline_api import TimelineEndpoint
from elasticrun.system.outsiders import Outsiders

SHUTDOWN_TIMEOUT_S = 2.0
PORT_RETRY_S = 0.1  # between tries of a port still in use (start's port_wait_s)
# Every worker of a job connects at once when a round opens: with the usual backlog of 128,
# a large job overflows the accept queue and the dropped connections retry only after 1 s
# or more. The kernel caps this at net.core.somaxconn.
LISTEN_BACKLOG = 4096


class WorkerServer:
    def __init__(self, secret: str, state: JobState, post: Callable[[ev.Event], None],
                 timeline: JobTimeline | None = None, epoch: int = 1,
                 superseded: Callable[[int], None] | None = None,
                 outsiders: Outsiders | None = None,
                 flash: FlashCadences | None = None) -> None:
        """`outsiders`: where requests refused for what outsiders sent are counted and
        logged (the driver's; its own otherwise); `flash`: where the workers' flash commit
        cadences go (the driver's, for /status)."""
        self._outsiders = outsiders if outsiders is not None else Outsiders()
        self._signing = RequestSigning(secret, epoch, superseded, self._outsiders)
        self.rounds = RoundEndpoints(state, post)
        self.kv = KVEndpoints(state)
        self.timeline = TimelineEndpoint(timeline or JobTimeline())
        self.results = ResultEndpoints(state)  # elasticrun.run's function and results
        self.flash = FlashEndpoint(flash if flash is not None else FlashCadences(),
                                   lambda worker: (record := state.workers.get(worker))
                                   is not None and record.alive)
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.listening: list[str] = []

    # --- the machine's actions that are the server's ----------------------------------
    def carry_out(self, action: ev.Action) -> bool:
        """Carries out `action` if it is the server's; False if it is not."""
        if isinstance(action, ev.AnswerJoin):
            self.rounds.answer_join(action.worker, action.reply)
        elif isinstance(action, ev.OpenRound):
            if action.number > 2:  # the round before the previous one is nobody's any more
                self.kv.store.delete_prefix(protocol.round_prefix(action.number - 2))
        elif isinstance(action, ev.BreakRound):
            self.kv.store.abandon_prefix(protocol.round_prefix(action.number))
            self.rounds.wake()
        elif isinstance(action, ev.PostNotice):
            self.rounds.post_notice(action.seq, action.update)
        elif isinstance(action, ev.ProbeRound):
            self.rounds.wake()  # the polls of its members answer with the probe
        else:
            return False
        return True

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self, host: str | Sequence[str], port: int = 0,
                    extra_routes: Iterable[web.RouteDef] = (), port_wait_s: float = 0.0,
                    listening: socket.socket | None = None) -> int:
        """Serves the worker endpoints, and `extra_routes` (which do their own auth), on
        one port of each address in `host`. `port_wait_s`: a port still in use is tried
        again for this long (a resumed driver's, just freed by the old one's death: the
        kernel releases a dead process's sockets a moment after it is gone). `listening`:
        a socket bound and listening already, served for the first address."""
        hosts = [host] if isinstance(host, str) else list(host)
        pace_for_serving()
        app = web.Application(client_max_size=protocol.MAX_BODY_BYTES,
                              middlewares=[self._signing.middleware])
        app.router.add_post(protocol.PATH_JOIN, self.rounds.join)
        app.router.add_post(protocol.PATH_NOTICES, self.rounds.notices)
        app.router.add_post(protocol.PATH_SYNCED, self.rounds.synced)
        app.router.add_post(protocol.PATH_TRAINED, self.rounds.trained)
        app.router.add_post(protocol.PATH_FAILING, self.rounds.failing)
        app.router.add_post(protocol.PATH_STALLED, self.rounds.stalled)
        app.router.add_post(protocol.PATH_PACE, self.rounds.paced)
        app.router.add_post(protocol.PATH_INIT, self.rounds.init_called)
        app.router.add_post(protocol.PATH_TIMELINE, self.timeline.handle)
        app.router.add_post(protocol.PATH_FLASH, self.flash.handle)
        app.router.add_post(protocol.PATH_RUN_FUNCTION, self.results.function)
        app.router.add_post(protocol.PATH_RUN_RESULT, self.results.result)
        app.router.add_post(protocol.PATH_KV_PREFIX + "{op}", self.kv.handle)
        added = app.router.add_routes(list(extra_routes))
        self._signing.open_resources = {route.resource for route in added}  # with their HEADs
        # Connections bounded in time and number (connections.py).
        self._runner = GuardedRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=SHUTDOWN_TIMEOUT_S,
                                     logger=self._outsiders.http_logger())
        await self._runner.setup()
        deadline = time.monotonic() + port_wait_s
        while True:
            site: web.BaseSite = web.TCPSite(self._runner, hosts[0], port, reuse_address=True,
                                             backlog=LISTEN_BACKLOG) if listening is None \
                else web.SockSite(self._runner, listening)
            try:
                await site.start()
                break
            except OSError as exc:
                await site.stop()
                if exc.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(PORT_RETRY_S)
        addresses = self._runner.addresses
        assert addresses, "the driver's server did not bind"
        self.port = int(addresses[0][1])
        self.listening = [hosts[0]]
        for other in hosts[1:]:
            await self.listen(other)
        return self.port

    async def listen(self, host: str) -> None:
        """Also serves on `host` (same port)."""
        assert self._runner is not None
        if host not in self.listening:
            await web.TCPSite(self._runner, host, self.port, reuse_address=True,
                              backlog=LISTEN_BACKLOG).start()
            self.listening.append(host)

    async def stop(self) -> None:
        self.rounds.close()
        self.kv.store.wake_all()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
