"""The driver's HTTP connections, bounded against whoever can reach its port.

aiohttp has no timeout for a request's headers, and keeps an idle connection for an hour:
each connection here must deliver a complete request header within HEADER_TIMEOUT_S of its
opening or of the first byte of its next request, and is closed after KEEPALIVE_S idle.
Connections that have not yet carried a signed request (signing.py calls trust()) are
capped per peer address: past MAX_UNTRUSTED_PER_PEER, a new one closes that address's
oldest one. Workers send their request as soon as they connect and are trusted within
milliseconds, so an address's oldest untrusted connections are the ones that stall.
aiohttp's error page for an unparsable request quotes the offending line (an
Authorization header, say): here it says only the status.

aiohttp names the class of its connections nowhere public but in AppRunner._make_server
(tests/integration/test_hostile_http.py checks that they are these).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_request import BaseRequest

from elasticrun import protocol

HEADER_TIMEOUT_S = 10.0
# Workers re-ask a long-poll (at most MAX_POLL_S) as soon as it answers; a connection idle
# three times that long belongs to a worker busy training, which reconnects when it calls.
KEEPALIVE_S = 3 * protocol.MAX_POLL_S
# A signed request's body (at most MAX_BODY_BYTES) must arrive within this: 140 KB/s.
BODY_TIMEOUT_S = 30.0
MAX_UNTRUSTED_PER_PEER = 1024
# Worst case of one connection's buffered header: MAX_HEADERS lines of 8 KiB.
MAX_HEADERS = 32
HANDLER_ARGS: dict[str, Any] = {
    "keepalive_timeout": KEEPALIVE_S,
    # A body its handler did not read is not drained (aiohttp reads it for 10 s by default):
    # the connection closes instead.
    "lingering_time": 0,
    # Workers never compress: a compressed body is refused, never inflated (signing.py).
    "auto_decompress": False,
    "max_headers": MAX_HEADERS,
}


class GuardedRunner(web.AppRunner):
    """AppRunner whose connections are GuardedConnections."""

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()
        return GuardedServer(plain.request_handler, request_factory=plain.request_factory,
                             handler_cancellation=plain.handler_cancellation,
                             loop=asyncio.get_running_loop(),
                             **{**plain._kwargs, **HANDLER_ARGS})


class GuardedServer(web.Server):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.untrusted: dict[str, OrderedDict[GuardedConnection, None]] = {}

    def __call__(self) -> GuardedConnection:
        return GuardedConnection(self, loop=self._loop, **self._kwargs)

    def admit(self, connection: GuardedConnection) -> None:
        """Counts a new connection as untrusted; closes its address's oldest untrusted one
        past the cap."""
        held = self.untrusted.setdefault(connection.peer, OrderedDict())
        held[connection] = None
        if len(held) > MAX_UNTRUSTED_PER_PEER:
            oldest, _ = held.popitem(last=False)
            oldest.force_close()

    def release(self, connection: GuardedConnection) -> None:
        held = self.untrusted.get(connection.peer)
        if held is not None:
            held.pop(connection, None)
            if not held:
                del self.untrusted[connection.peer]


class GuardedConnection(web.RequestHandler):
    __slots__ = ("_head_timer", "_head_of", "peer", "_guarded_server")

    def __init__(self, manager: GuardedServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guarded_server = manager
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_of = 0  # the request count when the timer was armed
        self.peer = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peername = transport.get_extra_info("peername")
        self.peer = str(peername[0]) if peername else "?"
        self._guarded_server.admit(self)
        self._arm()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        self._guarded_server.release(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        count = self._request_count
        super().data_received(data)
        if self._request_count != count or self._upgraded:
            self._disarm()  # a request's header is complete
        elif data and self._head_timer is None and self._awaiting_request():
            self._arm()  # the first bytes of the next request

    def trust(self) -> None:
        """This connection carried a request signed with the job secret."""
        self._guarded_server.release(self)

    def handle_error(self, request: BaseRequest, status: int = 500,
                     exc: BaseException | None = None, message: str | None = None
                     ) -> web.StreamResponse:
        # aiohttp's `message` quotes what it could not parse: never echoed.
        return super().handle_error(request, status, exc, _status_line(status))

    def _awaiting_request(self) -> bool:
        """Waiting for a request's header: no request in hand (bytes now are a header's)."""
        waiter = self._waiter
        return (waiter is not None and not waiter.done()) or self._request_count == 0

    def _arm(self) -> None:
        self._disarm()
        self._head_of = self._request_count
        self._head_timer = self._loop.call_later(HEADER_TIMEOUT_S, self._header_overdue)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _header_overdue(self) -> None:
        self._head_timer = None
        if self._request_count == self._head_of and self._awaiting_request():
            self.force_close()


def trust(request: web.BaseRequest) -> None:
    """Marks `request`'s connection as a worker's (no longer counted against its address)."""
    connection = request.protocol
    if isinstance(connection, GuardedConnection):
        connection.trust()


def _status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)
