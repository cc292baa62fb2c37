"""The driver's operator endpoints: the host-change webhook, /status and /metrics.

The webhook (`/v1/hosts`) takes a bearer token that is separate from the job secret the
workers sign with: an autoscaler can change hosts but cannot act as a worker. /status and
/metrics are read-only and hold no secret.

    GET  /v1/hosts              the host list and the drained hosts
    PUT  /v1/hosts              {"hosts": {"node1": 4, ...}}  replace the list (webhook discovery)
    POST /v1/hosts/add          {"hosts": {"node3": 4}} or {"hosts": ["node3:4"]}
    POST /v1/hosts/remove       {"hosts": ["node1"]}
    POST /v1/hosts/drain        {"hosts": ["node2"]}  its workers leave at the next commit
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import Any, Protocol

from aiohttp import web

from elasticrun.discovery.base import HostSlots
from elasticrun.discovery.parsing import MAX_SLOTS_PER_HOST, parse_host_entry
from elasticrun.driver.hosts.watcher import PushRefused
from elasticrun.driver.operate.metrics import CONTENT_TYPE
from elasticrun.system.outsiders import Outsiders

log = logging.getLogger("elasticrun.control")

PATH_HOSTS = "/v1/hosts"
PATH_STATUS = "/status"
PATH_METRICS = "/metrics"
MAX_PUSH_BYTES = 256 * 1024
MAX_HOSTS_PER_PUSH = 10_000


class OperatorTarget(Protocol):
    """What the endpoints read and change (target.py: JobOperator)."""

    def status(self) -> dict[str, Any]: ...

    def metrics(self) -> bytes: ...

    def hosts_view(self) -> dict[str, Any]: ...

    def push_hosts(self, action: str, hosts: HostSlots) -> dict[str, Any]: ...


class OperatorRoutes:
    def __init__(self, target: OperatorTarget, token: str | None, default_slots: int,
                 outsiders: Outsiders | None = None) -> None:
        """`outsiders`: where refused requests are counted and logged (the driver's)."""
        self._target = target
        self._token = token.encode() if token else None
        self._default_slots = default_slots
        self.outsiders = outsiders if outsiders is not None else Outsiders()

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get(PATH_STATUS, self._status),
            web.get(PATH_METRICS, self._metrics),
            web.get(PATH_HOSTS, self._hosts),
            web.put(PATH_HOSTS, self._push),
            web.post(PATH_HOSTS, self._push),  # answers 405: set needs PUT
            web.post(PATH_HOSTS + "/{action}", self._push),
        ]

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response(self._target.status(), dumps=_dumps)

    async def _metrics(self, request: web.Request) -> web.Response:
        response = web.Response(body=self._target.metrics())
        response.headers["Content-Type"] = CONTENT_TYPE
        return response

    async def _hosts(self, request: web.Request) -> web.Response:
        refused = self._refuse(request)
        if refused is not None:
            return refused
        return web.json_response(self._target.hosts_view(), dumps=_dumps)

    async def _push(self, request: web.Request) -> web.Response:
        refused = self._refuse(request)  # first: an outsider's body is never read
        if refused is not None:
            return refused
        action = request.match_info.get("action", "set")
        if action not in ("add", "remove", "drain", "set"):
            return _error(404, f"unknown action {action[:40]!r}; expected add, remove or drain")
        if action == "set" and request.method != "PUT":
            return _error(405, "replace the host list with PUT /v1/hosts")
        try:
            body = b""
            while len(body) <= MAX_PUSH_BYTES:  # read() returns what has arrived so far
                chunk = await request.content.read(MAX_PUSH_BYTES + 1 - len(body))
                if not chunk:
                    break
                body += chunk
            if len(body) > MAX_PUSH_BYTES:
                return _error(413, f"body larger than {MAX_PUSH_BYTES} bytes")
            hosts = self._parse_hosts(body, names_only=action in ("remove", "drain"))
        except ValueError as exc:
            return _error(400, str(exc))
        except ConnectionError:
            return _error(400, "connection lost")
        try:
            result = self._target.push_hosts(action, hosts)
        except PushRefused as exc:
            return _error(409, str(exc))
        log.info("host-change webhook from %s: %s %s", request.remote, action,
                 ",".join(hosts) or "(no hosts)")
        return web.json_response(result, dumps=_dumps)

    def _refuse(self, request: web.Request) -> web.Response | None:
        if self._token is None:
            return _error(403, "the host-change webhook is off: start the job with "
                               "--webhook-token-file or ELASTICRUN_WEBHOOK_TOKEN")
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode("utf-8", "replace"), self._token):
            self.outsiders.refused("wrong_webhook_token", request.remote)
            return web.json_response({"error": "missing or wrong bearer token"}, status=401,
                                     headers={"WWW-Authenticate": "Bearer"})
        return None

    def _parse_hosts(self, body: bytes, names_only: bool) -> HostSlots:
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise ValueError("body is not JSON") from None
        if not isinstance(payload, dict) or "hosts" not in payload:
            raise ValueError('expected a JSON object with "hosts"')
        raw = payload["hosts"]
        if isinstance(raw, dict):
            entries = list(raw.items())
        elif isinstance(raw, list):
            entries = [(item, None) for item in raw]
        else:
            raise ValueError('"hosts" must be an object {host: slots} or a list of "host[:slots]"')
        if len(entries) > MAX_HOSTS_PER_PUSH:
            raise ValueError(f"more than {MAX_HOSTS_PER_PUSH} hosts")
        hosts: HostSlots = {}
        for name, slots in entries:
            if not isinstance(name, str):
                raise ValueError(f"host {str(name)[:60]!r} is not a string")
            if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int)):
                raise ValueError(f"slots of {name[:60]!r} must be an integer")
            try:
                host, parsed = parse_host_entry(name.strip(), self._default_slots)
            except ValueError as exc:
                raise ValueError(f"host {name[:60]!r}: {exc}") from None
            if slots is not None:
                if not 0 <= slots <= MAX_SLOTS_PER_HOST:
                    raise ValueError(f"slots of {host!r} must be 0..{MAX_SLOTS_PER_HOST}")
                parsed = slots
            if not names_only and parsed < 1:
                raise ValueError(f"slots of {host!r} must be at least 1, got {parsed}")
            hosts[host] = parsed
        return hosts


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=False)
