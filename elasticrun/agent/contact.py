"""The agent's contact with the driver: one connection attempt, and how long the driver may
stay silent before the agent gives it up.

An attempt opens the websocket (its upgrade signed with the job's agent token), says hello
and waits for the driver's welcome; a refusal, of the token or by the driver's word, is final.
The driver's silence runs from the last thing heard from it: past the grace (or, before it
ever answered, the first contact's timeout when that is longer) the driver is gone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import aiohttp

from elasticrun import protocol
from elasticrun.launch.agents import wire
from elasticrun.system.timed import within

log = logging.getLogger("elasticrun.agent")

WELCOME_TIMEOUT_S = 10.0  # from the hello to the driver's answer


class Refused(Exception):
    """The driver will not take this agent, now or ever; the message says why."""


class DriverGone(Exception):
    """The driver has been silent for longer than the grace."""


class DriverContact:
    """Connects this agent to the driver at `driver` (http://host:port) and keeps the time
    it last heard from it."""

    def __init__(self, driver: str, token: str, token_hint: str, grace: float,
                 first_contact_timeout: float | None) -> None:
        self.driver = driver
        self._token = token
        self._token_hint = token_hint  # what a refusal of the token suggests checking
        self._grace = grace
        self._first_contact_timeout = first_contact_timeout
        self._last_heard = time.monotonic()
        self.welcomed = False  # a driver took this agent once

    def heard(self) -> None:
        """Something came from the driver: its silence starts over."""
        self._last_heard = time.monotonic()

    def silent_for(self) -> float:
        return time.monotonic() - self._last_heard

    def check_grace(self, why: str) -> None:
        """Raises DriverGone once the driver has been unreachable for longer than patience()."""
        silent = self.silent_for()
        log.debug("driver unreachable for %.1fs: %s", silent, why)
        if silent > self.patience():
            raise DriverGone

    def patience(self) -> float:
        """How long the driver may stay unreachable: its grace, or, before it ever
        answered, the first contact's timeout."""
        first = self._first_contact_timeout
        if self.welcomed or first is None:
            return self._grace
        return max(first, self._grace)

    async def connect(self, session: aiohttp.ClientSession, hello: Callable[[], wire.Hello]
                      ) -> tuple[aiohttp.ClientWebSocketResponse, wire.Welcome]:
        """One attempt: the connection and the driver's welcome. `hello` is called once the
        connection is open. Raises Refused, or (the driver cannot be reached now)
        aiohttp.ClientError, OSError, TimeoutError or wire.BadMessage."""
        headers = protocol.sign_headers(self._token, "GET", wire.PATH, b"")
        try:
            ws = await session.ws_connect(
                self.driver.rstrip("/") + wire.PATH, headers=headers,
                autoping=False, max_msg_size=wire.MAX_MESSAGE_BYTES,
                timeout=aiohttp.ClientWSTimeout(ws_close=2.0))
        except aiohttp.WSServerHandshakeError as exc:
            reason = (exc.headers.get(wire.REFUSED_HEADER) if exc.headers else None) \
                or exc.message
            if exc.status == 401:
                raise Refused(f"{reason} ({self._token_hint})") from None
            raise aiohttp.ClientError(f"{reason} ({exc.status})") from None
        await ws.send_str(wire.encode(hello()))
        reply = await within(ws.receive(), WELCOME_TIMEOUT_S)
        message = wire.decode(reply.data) if reply.type == aiohttp.WSMsgType.TEXT else None
        if isinstance(message, wire.Refused):
            await ws.close()
            raise Refused(message.reason)
        if not isinstance(message, wire.Welcome):
            await ws.close()
            raise aiohttp.ClientError("no welcome from the driver")
        self.heard()
        self.welcomed = True
        return ws, message
