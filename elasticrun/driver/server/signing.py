"""The server's gate for worker requests: a signature with the job secret, fresh, not replayed.

Operator routes (the webhook, /status, /metrics) pass through: they do their own auth.
A request that passes gets its JSON object body as `request[PAYLOAD]`. Fencing: every answer
carries this driver's epoch; a signed request naming a newer one (its worker has heard a
driver that resumed after this one) is refused, and this driver learns it was superseded.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from elasticrun import protocol
from elasticrun.driver.server.payload import BadRequest, error

log = logging.getLogger("elasticrun.rendezvous")

PAYLOAD = web.RequestKey("payload", dict)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class RequestSigning:
    def __init__(self, secret: str, epoch: int = 1,
                 superseded: Callable[[int], None] | None = None) -> None:
        self._guard = protocol.SignatureGuard(secret)
        self.open_resources: set[web.AbstractResource | None] = set()  # their own auth
        self.epoch = epoch  # this driver's, on every answer to a worker (fencing)
        # Called with the newer epoch a signed request names: a driver that resumed after
        # this one was stopped or cut off has taken the job over.
        self._superseded = superseded or (lambda _epoch: None)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.match_info.route.resource in self.open_resources:
            return await handler(request)
        response = await self._gated(request, handler)
        response.headers[protocol.HEADER_EPOCH] = str(self.epoch)
        return response

    async def _gated(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return error(413, "request body too large")
        except web.RequestPayloadError:
            return error(400, "unreadable request body")
        except ConnectionError:  # the worker went away mid-request (it may have died)
            return error(400, "connection lost")
        reason = self.verify(request, body)
        if reason is not None:
            log.debug("refused %s %s from %s: %s", request.method, request.path, request.remote,
                      reason)
            return error(401, reason)
        newer = request.headers.get(protocol.HEADER_EPOCH, "")
        if newer.isdigit() and int(newer) > self.epoch:  # signed: the job's own worker
            self._superseded(int(newer))
            return error(409, f"this driver (epoch {self.epoch}) was superseded by epoch "
                              f"{newer}")
        try:
            payload = json.loads(body) if body else {}
        except (ValueError, UnicodeDecodeError, RecursionError):
            return error(400, "body is not JSON")
        if not isinstance(payload, dict):
            return error(400, "body must be a JSON object")
        request[PAYLOAD] = payload
        try:
            return await handler(request)
        except BadRequest as exc:
            return error(400, str(exc))

    def verify(self, request: web.Request, body: bytes) -> str | None:
        """None when `request` is signed with this key, fresh and not replayed; else why not."""
        return self._guard.check(request.method, request.path_qs, body, request.headers,
                                 time.time())
