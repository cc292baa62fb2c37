"""The operator endpoints (elasticrun.driver.operate.routes), served by the real worker server
on 127.0.0.1 (in front of a real round machine): /status, /metrics, and the bearer-token
host-change webhook /v1/hosts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from elasticrun import protocol
from elasticrun.discovery.base import HostSlots
from elasticrun.driver.hosts.watcher import PushRefused
from elasticrun.driver.operate.metrics import CONTENT_TYPE
from elasticrun.driver.operate.routes import MAX_HOSTS_PER_PUSH, MAX_PUSH_BYTES, OperatorRoutes
from tests.rounds_server import RoundsServer

pytestmark = pytest.mark.timeout(30)

TOKEN = "t0ken-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
STATUS = {"job_id": "j1", "hosts": [{"host": "a", "state": "active"}], "round": 2}
METRICS = b"# HELP elasticrun_rounds Rounds.\nelasticrun_rounds 2.0\n"
HOSTS_VIEW = {"hosts": {"a": 2}, "drained": ["b"]}


@dataclass
class FakeTarget:
    pushes: list[tuple[str, HostSlots]] = field(default_factory=list)
    refuse: str | None = None

    def status(self) -> dict[str, Any]:
        return STATUS

    def metrics(self) -> bytes:
        return METRICS

    def hosts_view(self) -> dict[str, Any]:
        return HOSTS_VIEW

    def push_hosts(self, action: str, hosts: HostSlots) -> dict[str, Any]:
        if self.refuse is not None:
            raise PushRefused(self.refuse)
        self.pushes.append((action, dict(hosts)))
        return {"ok": True, "action": action}


@dataclass
class Reply:
    status: int
    text: str
    headers: dict[str, str]

    @property
    def json(self) -> Any:
        return json.loads(self.text)


@dataclass
class Server:
    target: FakeTarget
    rounds: RoundsServer
    base: str
    session: aiohttp.ClientSession

    async def send(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
                   headers: dict[str, str] | None = None) -> Reply:
        data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        async with self.session.request(method, self.base + path, data=data,
                                        headers=headers if headers is not None else AUTH
                                        ) as response:
            return Reply(response.status, await response.text(), dict(response.headers))


async def _start(token: str | None) -> AsyncIterator[Server]:
    target = FakeTarget()
    rv = RoundsServer(protocol.new_secret())
    routes = OperatorRoutes(target, token, default_slots=3)
    port = await rv.start(routes.routes())
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield Server(target, rv, f"http://127.0.0.1:{port}", session)
    await rv.stop()


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async for srv in _start(TOKEN):
        yield srv


@pytest.fixture
async def server_off() -> AsyncIterator[Server]:
    async for srv in _start(None):
        yield srv


# --------------------------------------------------------------------------- read-only


async def test_status_needs_no_token(server: Server) -> None:
    reply = await server.send("GET", "/status", headers={})
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("application/json")
    assert reply.json == STATUS


async def test_metrics_needs_no_token(server: Server) -> None:
    reply = await server.send("GET", "/metrics", headers={})
    assert reply.status == 200
    assert reply.headers["Content-Type"] == CONTENT_TYPE
    assert reply.text.encode() == METRICS


@pytest.mark.parametrize("path", ["/status", "/metrics"])
async def test_head_needs_no_token(server: Server, path: str) -> None:
    assert (await server.send("HEAD", path, headers={})).status == 200


async def test_post_status_is_refused(server: Server) -> None:
    reply = await server.send("POST", "/status", {"hosts": {"a": 1}})
    assert reply.status in (401, 405)
    assert server.target.pushes == []


async def test_get_hosts_with_token(server: Server) -> None:
    reply = await server.send("GET", "/v1/hosts")
    assert (reply.status, reply.json) == (200, HOSTS_VIEW)


# --------------------------------------------------------------------------- pushes


@pytest.mark.parametrize(
    ("method", "path", "body", "action", "hosts"),
    [
        ("PUT", "/v1/hosts", {"hosts": {"h": 2, "[fe80::1]": 1}}, "set",
         {"h": 2, "fe80::1": 1}),
        ("POST", "/v1/hosts/add", {"hosts": ["h:2", "h2", "[fe80::1]:4", " n3 slots=5 "]},
         "add", {"h": 2, "h2": 3, "fe80::1": 4, "n3": 5}),
        ("POST", "/v1/hosts/add", {"hosts": {"h": 2, "h2:9": 1}}, "add", {"h": 2, "h2": 1}),
        ("POST", "/v1/hosts/remove", {"hosts": ["h", "fe80::1"]}, "remove",
         {"h": 3, "fe80::1": 3}),
        ("POST", "/v1/hosts/drain", {"hosts": ["h"]}, "drain", {"h": 3}),
        ("POST", "/v1/hosts/drain", {"hosts": ["h:0"]}, "drain", {"h": 0}),
        ("PUT", "/v1/hosts", {"hosts": []}, "set", {}),
    ],
)
async def test_push(server: Server, method: str, path: str, body: Any, action: str,
                    hosts: HostSlots) -> None:
    reply = await server.send(method, path, body)
    assert (reply.status, reply.json) == (200, {"ok": True, "action": action})
    assert server.target.pushes == [(action, hosts)]
    assert list(server.target.pushes[0][1]) == list(hosts)  # order kept


async def test_push_refused_by_target(server: Server) -> None:
    server.target.refuse = "the job does not use --discovery webhook"
    reply = await server.send("PUT", "/v1/hosts", {"hosts": {"h": 1}})
    assert (reply.status, reply.json) == (
        409, {"error": "the job does not use --discovery webhook"})


# --------------------------------------------------------------------------- auth


async def test_push_without_valid_token(server: Server) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"},
                    {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": TOKEN}):
        for method, path in [("PUT", "/v1/hosts"), ("POST", "/v1/hosts/add"),
                             ("GET", "/v1/hosts")]:
            reply = await server.send(method, path, {"hosts": {"h": 1}}, headers=headers)
            assert reply.status == 401, (headers, method, path)
            assert reply.headers["WWW-Authenticate"] == "Bearer"
            assert reply.json == {"error": "missing or wrong bearer token"}
    assert server.target.pushes == []


async def test_bearer_scheme_is_case_insensitive(server: Server) -> None:
    reply = await server.send("POST", "/v1/hosts/add", {"hosts": ["h"]},
                              headers={"Authorization": f"bearer {TOKEN}"})
    assert reply.status == 200
    assert server.target.pushes == [("add", {"h": 3})]


async def test_webhook_off_without_token(server_off: Server) -> None:
    for method, path in [("PUT", "/v1/hosts"), ("POST", "/v1/hosts/drain"),
                         ("GET", "/v1/hosts")]:
        reply = await server_off.send(method, path, {"hosts": ["h"]})
        assert reply.status == 403
        assert "--webhook-token-file" in reply.json["error"]
    assert server_off.target.pushes == []
    assert (await server_off.send("GET", "/status", headers={})).status == 200


async def test_worker_endpoints_still_need_the_signature(server: Server) -> None:
    body = {"worker_id": "w", "last_round": 0}
    for headers in ({}, AUTH):
        reply = await server.send("POST", protocol.PATH_JOIN, body, headers=headers)
        assert reply.status == 401
    reply = await server.send("POST", protocol.PATH_KV_PREFIX + "get", {"key": "k"})
    assert reply.status == 401
    assert server.rounds.events == []  # nothing reached the round machine


# --------------------------------------------------------------------------- bad requests


@pytest.mark.parametrize(
    ("path", "raw", "fragment"),
    [
        ("/v1/hosts/add", b"{not json", "body is not JSON"),
        ("/v1/hosts/add", b"[1, 2]", 'expected a JSON object with "hosts"'),
        ("/v1/hosts/add", b'{"host": ["h"]}', 'expected a JSON object with "hosts"'),
        ("/v1/hosts/add", b'{"hosts": "h:1"}', '"hosts" must be an object'),
        ("/v1/hosts/add", b'{"hosts": {"h": "2"}}', "slots of 'h' must be an integer"),
        ("/v1/hosts/add", b'{"hosts": {"h": true}}', "slots of 'h' must be an integer"),
        ("/v1/hosts/add", b'{"hosts": {"h": -1}}', "slots of 'h' must be 0..4096"),
        ("/v1/hosts/add", b'{"hosts": {"h": 4097}}', "slots of 'h' must be 0..4096"),
        ("/v1/hosts/add", b'{"hosts": ["h:0"]}', "slots of 'h' must be at least 1, got 0"),
        ("/v1/hosts/add", b'{"hosts": ["bad host!"]}', "host 'bad host!': "),
        ("/v1/hosts/add", b'{"hosts": ["-bad"]}',
         "host '-bad': not a valid host name or address"),
        ("/v1/hosts/add", b'{"hosts": [""]}', "host '': expected one host per entry"),
        ("/v1/hosts/add", b'{"hosts": [7]}', "host '7' is not a string"),
        ("/v1/hosts/remove", b'{"hosts": ["[fe80::zz]"]}', "not a valid IPv6 address"),
    ],
)
async def test_bad_body_is_400(server: Server, path: str, raw: bytes, fragment: str) -> None:
    reply = await server.send("POST", path, raw=raw)
    assert reply.status == 400, reply.text
    assert fragment in reply.json["error"]
    assert server.target.pushes == []


async def test_too_many_hosts(server: Server) -> None:
    reply = await server.send("PUT", "/v1/hosts", {"hosts": ["h"] * (MAX_HOSTS_PER_PUSH + 1)})
    assert (reply.status, reply.json) == (400, {"error": f"more than {MAX_HOSTS_PER_PUSH} hosts"})
    assert server.target.pushes == []


# routes.py reads the body with `request.content.read(MAX_PUSH_BYTES + 1)`, which returns
# only what has arrived so far, not up to the limit: a body in more than one TCP segment is cut.


async def test_body_in_two_segments(server: Server) -> None:
    body = json.dumps({"hosts": ["a:1", "b:2"]}).encode()
    port = int(server.base.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"PUT /v1/hosts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                 + TOKEN.encode() + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                 % len(body) + body[:10])
    await writer.drain()
    await asyncio.sleep(0.2)
    writer.write(body[10:])
    await writer.drain()
    answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    assert server.target.pushes == [("set", {"a": 1, "b": 2})]


async def test_body_too_large(server: Server) -> None:
    raw = b'{"hosts": ["h"], "pad": "' + b"x" * MAX_PUSH_BYTES + b'"}'
    reply = await server.send("PUT", "/v1/hosts", raw=raw)
    assert (reply.status, reply.json) == (
        413, {"error": f"body larger than {MAX_PUSH_BYTES} bytes"})
    assert server.target.pushes == []


async def test_body_at_the_limit_is_read(server: Server) -> None:
    head = b'{"hosts": ["h"], "pad": "'
    raw = head + b"x" * (MAX_PUSH_BYTES - len(head) - 2) + b'"}'
    assert len(raw) == MAX_PUSH_BYTES
    reply = await server.send("PUT", "/v1/hosts", raw=raw)
    assert reply.status == 200
    assert server.target.pushes == [("set", {"h": 3})]


async def test_unknown_action_is_404(server: Server) -> None:
    reply = await server.send("POST", "/v1/hosts/reboot", {"hosts": ["h"]})
    assert reply.status == 404
    assert reply.json == {"error": "unknown action 'reboot'; expected add, remove or drain"}
    assert server.target.pushes == []


@pytest.mark.parametrize("path", ["/v1/hosts/set", "/v1/hosts"])
async def test_set_needs_put(server: Server, path: str) -> None:
    reply = await server.send("POST", path, {"hosts": {"h": 1}})
    assert (reply.status, reply.json["error"]) == (405, "replace the host list with PUT /v1/hosts")
    reply = await server.send("POST", path, {"hosts": {"h": 1}}, headers={})
    assert (reply.status, reply.headers["WWW-Authenticate"]) == (401, "Bearer")
    assert server.target.pushes == []
