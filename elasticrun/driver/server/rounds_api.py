"""The worker endpoints of the round machine: join, notices, synced, failing, stalled.

Each request becomes a machine event; answers come from the machine's state, or, for a
join, from its AnswerJoin action. Long-polls hold the request until the answer exists or
their bound passes (then the worker asks again). A notice poll also carries the liveness
probes of a stalled round (liveness.py): a probe newer than the one the worker answered
ends its poll at once, and its next poll is the answer.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from aiohttp import web

from elasticrun import protocol
from elasticrun.driver.rounds.events import (
    Event,
    InitCalled,
    JoinAsked,
    ProbeAnswered,
    WorkerFailing,
    WorkerPaced,
    WorkerStalled,
    WorkerSynced,
    WorkerTrained,
)
from elasticrun.driver.rounds.state import JobState
from elasticrun.driver.server import payload as p
from elasticrun.driver.server.signing import PAYLOAD

RETRY = protocol.JoinReply("retry")
# Notices a poll can be answered with: a worker more than this many behind only needs to
# know that something changed (the sequence number says so).
NOTICES_KEPT = 64


class RoundEndpoints:
    def __init__(self, state: JobState, post: Callable[[Event], None]) -> None:
        self._state = state
        self._post = post
        self._joins: dict[str, asyncio.Future[protocol.JoinReply]] = {}
        # Held joins in arrival order, with their deadlines: one timer for the oldest instead
        # of one per join (every join of a round is held until its last member joins).
        self._expiries: deque[tuple[float, asyncio.Future[protocol.JoinReply]]] = deque()
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._changes: set[asyncio.Future[bool]] = set()  # notice long-polls, until a change
        self._notices: deque[protocol.Notice] = deque(maxlen=NOTICES_KEPT)
        self.closing = False

    def _known(self, worker_id: str) -> bool:
        worker = self._state.workers.get(worker_id)
        return worker is not None and worker.alive

    # --- what the driver calls ---------------------------------------------------------
    def answer_join(self, worker_id: str, reply: protocol.JoinReply) -> None:
        waiter = self._joins.get(worker_id)
        if waiter is not None:
            _settle(waiter, reply)

    def post_notice(self, seq: int, update: protocol.HostUpdateResult) -> None:
        self._notices.append(protocol.Notice(seq, int(time.time()), update))
        self.wake()

    def wake(self) -> None:
        """A notice was posted or a round broke: notice long-polls answer now."""
        waiters, self._changes = self._changes, set()
        for waiter in waiters:
            _settle(waiter, True)

    def close(self) -> None:
        self.closing = True  # long-polls answer at once instead of holding the shutdown
        self.wake()
        for waiter in list(self._joins.values()):
            _settle(waiter, RETRY)
        self._expiries.clear()
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None

    # --- endpoints ------------------------------------------------------------------------
    async def join(self, request: web.Request) -> web.Response:
        body = request[PAYLOAD]
        event = JoinAsked(p.string(body, "worker_id"), p.integer(body, "last_round"),
                          p.text(body, "failure", ""), p.flag(body, "committed"))
        if not self._known(event.worker):
            return p.error(403, "unknown worker")
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[protocol.JoinReply] = loop.create_future()
        superseded = self._joins.get(event.worker)
        if superseded is not None:  # the worker asked again (a dropped connection): the
            _settle(superseded, RETRY)  # machine's answer goes to the newest request
        self._joins[event.worker] = waiter
        self._hold(loop, waiter)
        try:
            if self.closing:
                _settle(waiter, RETRY)
            self._post(event)
            reply = await waiter
        finally:
            if self._joins.get(event.worker) is waiter:
                del self._joins[event.worker]
        return web.json_response(reply.to_json())

    def _hold(self, loop: asyncio.AbstractEventLoop,
              waiter: asyncio.Future[protocol.JoinReply]) -> None:
        """`waiter` answers "retry" when held MAX_POLL_S."""
        expiries = self._expiries
        while expiries and expiries[0][1].done():  # answered: forget them
            expiries.popleft()
        deadline = loop.time() + protocol.MAX_POLL_S
        expiries.append((deadline, waiter))
        if self._expiry_timer is None:
            self._expiry_timer = loop.call_at(deadline, self._expire, loop)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        """Answers the joins held past their deadline, and waits for the next one's.
        The deadlines are in arrival order: each is MAX_POLL_S after its join arrived."""
        expiries, now = self._expiries, loop.time()
        while expiries and (expiries[0][0] <= now or expiries[0][1].done()):
            _settle(expiries.popleft()[1], RETRY)
        self._expiry_timer = loop.call_at(expiries[0][0], self._expire, loop) \
            if expiries else None

    async def synced(self, request: web.Request) -> web.Response:
        body = request[PAYLOAD]
        restored = None
        if "restored_commit" in body:
            restored = (p.integer(body, "restored_commit"), p.text(body, "restored_from"))
        return self._report(WorkerSynced(p.string(body, "worker_id"),
                                         p.integer(body, "round"), restored))

    async def trained(self, request: web.Request) -> web.Response:
        body = request[PAYLOAD]
        return self._report(WorkerTrained(p.string(body, "worker_id")))

    async def failing(self, request: web.Request) -> web.Response:
        body = request[PAYLOAD]
        return self._report(WorkerFailing(p.string(body, "worker_id"),
                                          p.text(body, "failure"),
                                          p.flag(body, "unrecoverable")))

    async def init_called(self, request: web.Request) -> web.Response:
        body = request[PAYLOAD]
        return self._report(InitCalled(p.string(body, "worker_id")))

    async def stalled(self, request: web.Request) -> web.Response:
        body = request[PAYLOAD]
        return self._report(WorkerStalled(p.string(body, "worker_id"),
                                          p.integer(body, "round"),
                                          p.seconds(body, "waited_s")))

    async def paced(self, request: web.Request) -> web.Response:
        body = request[PAYLOAD]
        return self._report(WorkerPaced(p.string(body, "worker_id"), p.integer(body, "round"),
                                        p.number(body, "busy", 0.0, 1.0),
                                        p.seconds(body, "interval_s")))

    def _report(self, event: WorkerSynced | WorkerFailing | WorkerStalled | InitCalled
                | WorkerTrained | WorkerPaced) -> web.Response:
        if not self._known(event.worker):
            return p.error(403, "unknown worker")
        self._post(event)
        return web.json_response({})

    async def notices(self, request: web.Request) -> web.Response:
        """Long-polls until a notice newer than `after` exists, round `round` broke, or a
        probe of it newer than `probe_ack` began."""
        body = request[PAYLOAD]
        after = p.integer(body, "after")
        watched = p.integer(body, "round", default=0)
        acked = p.integer(body, "probe_ack", default=0)
        deadline = time.monotonic() + p.poll_timeout(body)
        if acked:
            self._answered(body, watched, acked)
        state = self._state
        while state.notice_seq <= after and not (0 < watched <= state.broken_round) \
                and self._probe(watched) <= acked and await self._changed(deadline):
            pass
        return web.json_response({
            "seq": state.notice_seq, "broken_round": state.broken_round,
            "probe": self._probe(watched),
            "notices": [n.to_json() for n in self._notices if n.seq > after]})

    def _probe(self, watched: int) -> int:
        """The probe of round `watched` its members are to answer (0: none)."""
        stall = self._state.stall
        return stall.probe if stall is not None and stall.round == watched else 0

    def _answered(self, body: dict[str, object], watched: int, acked: int) -> None:
        worker_id = p.string(body, "worker_id")
        liveness = p.obj(body, "liveness")
        if liveness is None or not self._known(worker_id):
            return
        # since_s: a difference of the worker's clock readings, from two threads (a torn
        # read may make it a little negative; the machine counts it as 0).
        since = p.number(liveness, "since_s", -p.MAX_SECONDS, p.MAX_SECONDS, 0.0)
        self._post(ProbeAnswered(worker_id, watched, acked, p.flag(liveness, "in_collective"),
                                 since, p.maybe_seconds(liveness, "cpu_s")))

    async def _changed(self, deadline: float) -> bool:
        """True when woken before `deadline` (time.monotonic()), else False. A future and a
        timer per wait: asyncio.wait_for costs a task each."""
        remaining = deadline - time.monotonic()
        if self.closing or remaining <= 0:
            return False
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        timer = loop.call_later(remaining, _settle, waiter, False)
        self._changes.add(waiter)
        try:
            return await waiter
        finally:
            timer.cancel()
            self._changes.discard(waiter)


def _settle(waiter: asyncio.Future, value: object) -> None:  # type: ignore[type-arg]
    if not waiter.done():
        waiter.set_result(value)
