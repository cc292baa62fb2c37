"""The server's gate for worker requests: a signature with the job secret, fresh, not replayed.

Operator routes (the webhook, /status, /metrics) pass through: they do their own auth.
The signature covers the body's digest (a header), so it is checked before any of the body
is read: a refused request is answered without reading its body, and its connection closed
(so the rest of it is never read either). Only then is the body read (within
BODY_TIMEOUT_S, at most MAX_BODY_BYTES) and checked against the digest; its nonce is spent
once all of it passed. A request that passes gets its JSON object body as
`request[PAYLOAD]`. Fencing: every answer carries this driver's epoch; a signed request
naming a newer one (its worker has heard a driver that resumed after this one) is refused,
and this driver learns it was superseded.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from elasticrun import protocol
from elasticrun.driver.server.connections import BODY_TIMEOUT_S, trust
from elasticrun.driver.server.payload import BadRequest, error
from elasticrun.system.outsiders import Outsiders, signature_kind
from elasticrun.system.timed import within

log = logging.getLogger("elasticrun.rendezvous")

PAYLOAD = web.RequestKey("payload", dict)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class RequestSigning:
    def __init__(self, secret: str, epoch: int = 1,
                 superseded: Callable[[int], None] | None = None,
                 outsiders: Outsiders | None = None) -> None:
        self._guard = protocol.SignatureGuard(secret)
        self._outsiders = outsiders if outsiders is not None else Outsiders()
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
        refusal = _unreadable(request)  # from its headers: before even its signature's
        if refusal is not None:
            kind = "body_too_large" if refusal.status == 413 else "malformed_http"
            self._outsiders.refused(kind, request.remote)
            return _closing(refusal)
        now = time.time()
        reason = self._guard.check_headers(request.method, request.path_qs, request.headers,
                                           now)
        if reason is not None:
            return self._refused(request, 401, reason)
        body = await _read(request)
        if isinstance(body, web.Response):
            return _closing(body)
        claimed = request.headers.get(protocol.HEADER_BODY_DIGEST) or protocol.EMPTY_BODY_DIGEST
        if not hmac.compare_digest(claimed.encode(errors="replace"),
                                   protocol.body_digest(body).encode()):
            return self._refused(request, 401, "bad signature")  # not of this body
        reason = self._guard.spend(request.headers, now)
        if reason is not None:
            return self._refused(request, 401, reason)
        trust(request)
        newer = request.headers.get(protocol.HEADER_EPOCH, "")
        if newer and not (newer.isascii() and newer.isdigit() and len(newer) <= 18):
            return error(400, f"{protocol.HEADER_EPOCH} must be a number")
        if newer and int(newer) > self.epoch:  # signed: the job's own worker
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

    def _refused(self, request: web.Request, status: int, reason: str) -> web.Response:
        log.debug("refused %s %s from %s: %s", request.method, request.path, request.remote,
                  reason)
        self._outsiders.refused(signature_kind(reason), request.remote)  # counted, logged
        return _closing(error(status, reason))


def _unreadable(request: web.Request) -> web.Response | None:
    """Why the body of a signed request is not even read, if it is not."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):  # workers never compress: nothing is inflated
        return error(415, "compressed request bodies are not accepted")
    if (request.content_length or 0) > protocol.MAX_BODY_BYTES:
        return error(413, "request body too large")
    return None


async def _read(request: web.Request) -> bytes | web.Response:
    """The body (at most MAX_BODY_BYTES, within BODY_TIMEOUT_S), or the answer why not."""
    try:
        return await within(request.read(), BODY_TIMEOUT_S)
    except web.HTTPRequestEntityTooLarge:
        return error(413, "request body too large")
    except web.RequestPayloadError:
        return error(400, "unreadable request body")
    except TimeoutError:
        return error(408, "request body too slow")
    except ConnectionError:  # the worker went away mid-request (it may have died)
        return error(400, "connection lost")


def _closing(response: web.Response) -> web.Response:
    """`response`, on a connection closed after it: the rest of the request is never read."""
    response.force_close()
    return response
