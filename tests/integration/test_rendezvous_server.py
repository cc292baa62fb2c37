"""Integration tests of the driver's worker server (elasticrun.driver.server) over real HTTP.

Every test starts a real `WorkerServer` on 127.0.0.1 in front of a real `RoundMachine`
(tests/rounds_server.py: the executor between them carries out the machine's actions as the
driver does) and talks to it with aiohttp, raw sockets, or the workers' blocking
`DriverClient`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from yarl import URL

from elasticrun import protocol
from elasticrun.driver.rounds import events as ev
from elasticrun.driver.rounds.assignment import SlotId, assign
from elasticrun.driver.rounds.state import WorkerStatus
from elasticrun.worker.client import DriverClient, RequestRefusedError
from tests.rounds_server import RoundsServer

SECRET = protocol.new_secret()
KV = protocol.PATH_KV_PREFIX
TESTER = "tester"  # a registered worker, member of no round: may use keys outside rounds

pytestmark = pytest.mark.timeout(60)


# --- fixtures and helpers ----------------------------------------------------------------


@dataclass
class Reply:
    status: int
    text: str

    @property
    def json(self) -> Any:
        return json.loads(self.text)


@dataclass
class Server:
    rv: RoundsServer
    port: int
    session: aiohttp.ClientSession

    def url(self, path: str) -> URL:
        # encoded=True: send the path exactly as given (and as signed), no normalisation.
        return URL(f"http://127.0.0.1:{self.port}{path}", encoded=True)

    async def send(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        timeout: float = 40.0,
    ) -> Reply:
        async with self.session.request(
            method,
            self.url(path),
            data=body,
            headers=headers or {},
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            return Reply(response.status, await response.text())

    async def signed(
        self,
        path: str,
        payload: Any = None,
        *,
        body: bytes | None = None,
        method: str = "POST",
        secret: str = SECRET,
        timeout: float = 40.0,
    ) -> Reply:
        """A correctly signed request (with `secret`); `payload` is JSON-encoded unless `body`.
        KV calls name the fixture's worker unless the payload names one."""
        if body is None:
            if path.startswith(KV) and isinstance(payload, dict):
                payload = {"worker": TESTER, **payload}
            body = json.dumps({} if payload is None else payload).encode()
        headers = protocol.sign_headers(secret, method, path, body)
        return await self.send(method, path, body, headers, timeout)

    async def kv(self, op: str, **payload: Any) -> Any:
        """A signed KV call that must succeed; `payload` is the JSON body (timeout included)."""
        reply = await self.signed(KV + op, payload)
        assert reply.status == 200, (op, reply)
        return reply.json


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def send_set_signed_at(server: Server, timestamp: str) -> Reply:
    """A `set` correctly signed with the secret, but carrying the given timestamp."""
    body = json.dumps({"worker": TESTER, "key": "k", "value": b64(b"v")}).encode()
    nonce = protocol.new_nonce()
    headers = {
        protocol.HEADER_TIMESTAMP: timestamp,
        protocol.HEADER_NONCE: nonce,
        protocol.HEADER_BODY_DIGEST: protocol.body_digest(body),
        protocol.HEADER_SIGNATURE: protocol.signature(
            SECRET, "POST", KV + "set", timestamp, nonce, body),
    }
    return await server.send("POST", KV + "set", body, headers)


async def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def raw_status(port: int, request: bytes) -> int:
    """Sends raw bytes (for what aiohttp's client refuses to send); returns the HTTP status."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
        return int(status_line.split()[1])
    finally:
        writer.close()


@pytest_asyncio.fixture
async def server():
    rv = RoundsServer(SECRET)
    rv.add_worker(TESTER, SlotId("tester-host", 0))
    port = await rv.start()
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    try:
        yield Server(rv, port, session)
    finally:
        await session.close()
        await rv.stop()


async def assert_still_serving(server: Server) -> None:
    key = f"alive/{protocol.new_nonce()}"
    await server.kv("set", key=key, value=b64(b"ok"))
    assert (await server.kv("get", key=key))["value"] == b64(b"ok")
    assert server.rv.store.get(key) == b"ok"


# --- 1. authentication --------------------------------------------------------------------


async def test_signed_request_is_accepted(server: Server) -> None:
    reply = await server.signed(KV + "set", {"key": "k", "value": b64(b"v")})
    assert reply.status == 200
    assert server.rv.store.get("k") == b"v"


@pytest.mark.parametrize("drop", [None, "timestamp", "nonce", "signature"])
async def test_unsigned_or_partly_signed_set_is_refused(server: Server, drop: str | None) -> None:
    body = json.dumps({"worker": TESTER, "key": "secret-key", "value": b64(b"x")}).encode()
    headers = protocol.sign_headers(SECRET, "POST", KV + "set", body)
    if drop is None:
        headers = {}
    else:
        del headers[{
            "timestamp": protocol.HEADER_TIMESTAMP,
            "nonce": protocol.HEADER_NONCE,
            "signature": protocol.HEADER_SIGNATURE,
        }[drop]]
    reply = await server.send("POST", KV + "set", body, headers)
    assert reply.status == 401
    assert reply.json["error"] == "unsigned request"
    assert server.rv.store.num_keys() == 0
    assert server.rv.store.get("secret-key") is None


async def test_wrong_secret_is_refused(server: Server) -> None:
    reply = await server.signed(
        KV + "set", {"key": "k", "value": b64(b"v")}, secret=protocol.new_secret())
    assert reply.status == 401
    assert reply.json["error"] == "bad signature"
    assert server.rv.store.num_keys() == 0


async def test_signature_over_other_body_path_or_method_is_refused(server: Server) -> None:
    body = json.dumps({"worker": TESTER, "key": "k", "value": b64(b"v")}).encode()
    other_body = json.dumps({"worker": TESTER, "key": "k", "value": b64(b"w")}).encode()
    cases = [
        # (what was signed: method, path, body) for a POST of `body` to KV set
        ("POST", KV + "set", other_body),
        ("POST", KV + "add", body),
        ("POST", KV + "set?x=1", body),
        ("PUT", KV + "set", body),
        ("GET", KV + "set", body),
    ]
    for method, path, signed_body in cases:
        headers = protocol.sign_headers(SECRET, method, path, signed_body)
        reply = await server.send("POST", KV + "set", body, headers)
        assert reply.status == 401, (method, path, signed_body)
        assert reply.json["error"] == "bad signature"
    assert server.rv.store.num_keys() == 0


@pytest.mark.parametrize(
    "offset", [-(protocol.SIGNATURE_WINDOW_S + 5), protocol.SIGNATURE_WINDOW_S + 5])
async def test_stale_or_future_timestamp_is_refused(server: Server, offset: float) -> None:
    reply = await send_set_signed_at(server, f"{time.time() + offset:.6f}")
    assert reply.status == 401
    assert reply.json["error"] == "stale request"
    assert server.rv.store.num_keys() == 0


async def test_timestamp_inside_window_is_accepted(server: Server) -> None:
    """Counterpart of the stale test: the same construction, 5 s old, is fine."""
    body = json.dumps({"worker": TESTER, "key": "k", "value": b64(b"v")}).encode()
    timestamp = f"{time.time() - 5:.6f}"
    nonce = protocol.new_nonce()
    headers = {
        protocol.HEADER_TIMESTAMP: timestamp,
        protocol.HEADER_NONCE: nonce,
        protocol.HEADER_BODY_DIGEST: protocol.body_digest(body),
        protocol.HEADER_SIGNATURE: protocol.signature(
            SECRET, "POST", KV + "set", timestamp, nonce, body),
    }
    assert (await server.send("POST", KV + "set", body, headers)).status == 200
    assert server.rv.store.get("k") == b"v"


async def test_malformed_timestamp_is_refused(server: Server) -> None:
    body = b"{}"
    for timestamp in ("yesterday", "0x10", "1e400x"):
        nonce = protocol.new_nonce()
        headers = {
            protocol.HEADER_TIMESTAMP: timestamp,
            protocol.HEADER_NONCE: nonce,
            protocol.HEADER_SIGNATURE: protocol.signature(
                SECRET, "POST", KV + "num_keys", timestamp, nonce, body),
        }
        reply = await server.send("POST", KV + "num_keys", body, headers)
        assert reply.status == 401, timestamp
        assert reply.json["error"] == "malformed timestamp"


@pytest.mark.parametrize("timestamp", ["nan", "NaN", "inf", "-inf", "infinity"])
async def test_non_finite_timestamp_is_refused(server: Server, timestamp: str) -> None:
    """A correctly signed request whose timestamp is NaN would never go stale (every
    comparison with NaN is False) and so could be replayed once its nonce is forgotten."""
    reply = await send_set_signed_at(server, timestamp)
    assert reply.status == 401
    assert server.rv.store.num_keys() == 0


async def test_exact_replay_is_refused_and_has_no_effect(server: Server) -> None:
    body = json.dumps({"worker": TESTER, "key": "counter", "amount": 1}).encode()
    headers = protocol.sign_headers(SECRET, "POST", KV + "add", body)
    first = await server.send("POST", KV + "add", body, headers)
    assert first.status == 200
    assert first.json == {"value": 1}
    replay = await server.send("POST", KV + "add", body, headers)
    assert replay.status == 401
    assert replay.json["error"] == "replayed request"
    assert server.rv.store.get("counter") == b"1"
    # A fresh signature of the same body is a new request and does count.
    assert (await server.kv("add", key="counter", amount=1)) == {"value": 2}


async def test_replay_on_a_fresh_connection_is_refused(server: Server) -> None:
    body = json.dumps({"worker": TESTER, "key": "counter", "amount": 5}).encode()
    headers = protocol.sign_headers(SECRET, "POST", KV + "add", body)
    assert (await server.send("POST", KV + "add", body, headers)).status == 200
    async with aiohttp.ClientSession() as other:
        async with other.post(server.url(KV + "add"), data=body, headers=headers) as response:
            assert response.status == 401
    assert server.rv.store.get("counter") == b"5"


# --- 2. malformed input -------------------------------------------------------------------

LONG_KEY = "k" * 1025

MALFORMED: list[tuple[str, str, bytes, int]] = [
    # (label, path, body, expected status); every one is correctly signed.
    ("not json", KV + "set", b"{not json", 400),
    ("not utf-8", KV + "set", b"\xff\xfe\x00{", 400),
    ("json list", KV + "set", b'["key", "value"]', 400),
    ("json number", KV + "set", b"42", 400),
    ("json string", KV + "set", b'"set"', 400),
    ("json null", KV + "set", b"null", 400),
    ("json true", KV + "num_keys", b"true", 400),
    ("missing key", KV + "set", b'{"value": "dg=="}', 400),
    ("missing value", KV + "set", b'{"key": "k"}', 400),
    ("empty body set", KV + "set", b"", 400),
    ("key is int", KV + "set", b'{"key": 7, "value": "dg=="}', 400),
    ("key is null", KV + "get", b'{"key": null}', 400),
    ("value is int", KV + "set", b'{"key": "k", "value": 5}', 400),
    ("value not base64", KV + "set", b'{"key": "k", "value": "not base64!!"}', 400),
    ("value bad padding", KV + "set", b'{"key": "k", "value": "dg="}', 400),
    ("expected not base64", KV + "compare_set",
     b'{"key": "k", "expected": "@@", "desired": "dg=="}', 400),
    ("desired missing", KV + "compare_set", b'{"key": "k", "expected": ""}', 400),
    ("key too long", KV + "set",
     json.dumps({"key": LONG_KEY, "value": "dg=="}).encode(), 400),
    ("key too long add", KV + "add", json.dumps({"key": LONG_KEY, "amount": 1}).encode(), 400),
    ("amount is bool", KV + "add", b'{"key": "k", "amount": true}', 400),
    ("amount is string", KV + "add", b'{"key": "k", "amount": "1"}', 400),
    ("amount is float", KV + "add", b'{"key": "k", "amount": 1.5}', 400),
    ("amount missing", KV + "add", b'{"key": "k"}', 400),
    ("timeout is string", KV + "get", b'{"key": "missing", "timeout": "1"}', 400),
    ("timeout is bool", KV + "wait", b'{"keys": ["k"], "timeout": true}', 400),
    ("timeout is NaN", KV + "wait", b'{"keys": ["k"], "timeout": NaN}', 400),
    ("keys not a list", KV + "wait", b'{"keys": "k", "timeout": 0}', 400),
    ("keys with int", KV + "check", b'{"keys": ["a", 1]}', 400),
    ("keys missing", KV + "multi_get", b"{}", 400),
    ("unknown kv op", KV + "explode", b"{}", 404),
    ("kv op with slash", KV + "set/extra", b'{"key": "k", "value": "dg=="}', 404),
    ("unknown path", "/v1/nothing/here", b"{}", 404),
    ("root path", "/", b"{}", 404),
    ("join no fields", protocol.PATH_JOIN, b"{}", 400),
    ("join worker_id int", protocol.PATH_JOIN, b'{"worker_id": 1, "last_round": 0}', 400),
    ("join last_round bool", protocol.PATH_JOIN,
     b'{"worker_id": "w0", "last_round": false}', 400),
    ("join last_round string", protocol.PATH_JOIN,
     b'{"worker_id": "w0", "last_round": "0"}', 400),
    ("join not object", protocol.PATH_JOIN, b"[]", 400),
    ("notices no after", protocol.PATH_NOTICES, b"{}", 400),
    ("notices after bool", protocol.PATH_NOTICES, b'{"after": true}', 400),
    ("notices timeout list", protocol.PATH_NOTICES, b'{"after": 0, "timeout": []}', 400),
]


async def test_malformed_signed_requests_get_4xx_and_change_nothing(server: Server) -> None:
    server.rv.add_worker("w0", SlotId("a", 0))
    await server.kv("set", key="k", value=b64(b"original"))
    before = dict(server.rv.store._data)
    failures = []
    for label, path, body, expected in MALFORMED:
        reply = await server.signed(path, body=body)
        if reply.status != expected:
            failures.append((label, reply.status, reply.text[:200]))
        elif expected == 400 or label == "unknown kv op":
            assert "error" in reply.json, label
    assert failures == []
    assert dict(server.rv.store._data) == before
    assert server.rv.events == []  # nothing reached the round machine
    await assert_still_serving(server)


async def test_add_on_non_integer_value_is_400(server: Server) -> None:
    await server.kv("set", key="k", value=b64(b"not a number"))
    reply = await server.signed(KV + "add", {"key": "k", "amount": 1})
    assert reply.status == 400
    assert server.rv.store.get("k") == b"not a number"


async def test_wrong_method_is_405(server: Server) -> None:
    for method in ("GET", "PUT", "DELETE", "PATCH"):
        for path in (KV + "set", protocol.PATH_JOIN, protocol.PATH_NOTICES):
            reply = await server.signed(path, body=b"", method=method)
            assert reply.status == 405, (method, path, reply)
    # Unsigned, the same requests are refused before routing.
    assert (await server.send("GET", KV + "set")).status == 401
    await assert_still_serving(server)


async def test_unknown_path_unsigned_is_401_not_404(server: Server) -> None:
    """Nothing about the route table leaks to an unauthenticated caller."""
    assert (await server.send("POST", "/v1/nothing", b"{}")).status == 401
    assert (await server.send("GET", "/")).status == 401


async def test_body_over_limit_is_413(server: Server) -> None:
    body = b'{"key": "big", "value": "' + b"A" * protocol.MAX_BODY_BYTES + b'"}'
    assert len(body) > protocol.MAX_BODY_BYTES
    headers = protocol.sign_headers(SECRET, "POST", KV + "set", body)
    reply = await server.send("POST", KV + "set", body, headers)
    assert reply.status == 413
    assert server.rv.store.num_keys() == 0
    # Unsigned, it is refused the same way (the size check comes first).
    assert (await server.send("POST", KV + "set", body)).status == 413
    await assert_still_serving(server)


async def test_body_just_under_limit_is_accepted(server: Server) -> None:
    """Counterpart of the 413 test: the limit is not stricter than documented."""
    envelope = len(b'{"worker": "tester", "key": "big", "value": ""}')
    room = (protocol.MAX_BODY_BYTES - envelope) // 4 * 4
    body = b'{"worker": "tester", "key": "big", "value": "' + b"A" * room + b'"}'
    assert len(body) <= protocol.MAX_BODY_BYTES
    reply = await server.signed(KV + "set", body=body)
    assert reply.status == 200
    assert len(server.rv.store.get("big") or b"") == room // 4 * 3


async def test_http_level_garbage_gets_4xx(server: Server) -> None:
    requests = [
        b"POST /v1/kv/n\xffm HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
        b"POST /v1/kv/set HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\nab\r\n",
        b"NOT A REQUEST\r\n\r\n",
        b"POST /v1/kv/set HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"POST /v1/kv/set HTTP/1.1\r\nBad Header Line\r\n\r\n",
    ]
    for request in requests:
        status = await raw_status(server.port, request)
        assert 400 <= status < 500, (request, status)
    await assert_still_serving(server)


@pytest.mark.parametrize("opener", [b"[", b'{"a":'])
async def test_deeply_nested_json_is_400(server: Server, opener: bytes) -> None:
    reply = await server.signed(KV + "set", body=opener * 100_000)
    assert reply.status == 400


@pytest.mark.parametrize(
    "encoding",
    [
        "gzip",
        "deflate",
        "br",
        "no-such-coding",
    ],
)
async def test_undecodable_content_encoding_is_4xx(server: Server, encoding: str) -> None:
    reply = await server.send(
        "POST", KV + "set", b"definitely not compressed", {"Content-Encoding": encoding})
    assert 400 <= reply.status < 500
    assert server.rv.store.num_keys() == 0


def _raw_signed_num_keys(
    nonce: bytes | None = None, signature: bytes | None = None
) -> bytes:
    body = b'{"worker": "tester"}'
    headers = protocol.sign_headers(SECRET, "POST", KV + "num_keys", body)
    lines = [
        b"POST " + (KV + "num_keys").encode() + b" HTTP/1.1",
        b"Host: 127.0.0.1",
        b"Content-Length: " + str(len(body)).encode(),
        b"Connection: close",
        protocol.HEADER_TIMESTAMP.encode() + b": " + headers[protocol.HEADER_TIMESTAMP].encode(),
        protocol.HEADER_BODY_DIGEST.encode() + b": "
        + headers[protocol.HEADER_BODY_DIGEST].encode(),
        protocol.HEADER_NONCE.encode() + b": "
        + (nonce if nonce is not None else headers[protocol.HEADER_NONCE].encode()),
        protocol.HEADER_SIGNATURE.encode() + b": "
        + (signature if signature is not None else headers[protocol.HEADER_SIGNATURE].encode()),
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


@pytest.mark.parametrize(
    "nonce, signature",
    [
        pytest.param(None, None, id="well-signed"),
        pytest.param("é".encode(), None, id="utf8-nonce"),
        pytest.param(b"\xff\xfe", None, id="non-utf8-nonce"),
        pytest.param(None, "é".encode(), id="utf8-signature"),
        pytest.param(None, b"\xff" * 64, id="non-utf8-signature"),
    ],
)
async def test_non_ascii_auth_headers(
    server: Server, nonce: bytes | None, signature: bytes | None
) -> None:
    status = await raw_status(server.port, _raw_signed_num_keys(nonce, signature))
    assert status == (200 if nonce is None and signature is None else 401)
    await assert_still_serving(server)


# --- 3. fuzz ------------------------------------------------------------------------------

REAL_PATHS = [protocol.PATH_JOIN, protocol.PATH_NOTICES, protocol.PATH_SYNCED,
              protocol.PATH_FAILING, *(KV + op for op in protocol.KV_OPS)]
FIELDS = ["key", "keys", "value", "expected", "desired", "amount", "timeout", "worker_id",
          "last_round", "after", "round", "failure", "committed"]
# Header values: printable ASCII only (aiohttp's client refuses CR/LF; non-ASCII auth headers
# are a known bug, covered by test_non_ascii_auth_headers). Content-Encoding and framing
# headers are left out: undecodable encodings are a known bug (see above), and a wrong
# Content-Length would make the server wait for body bytes that never come.
ascii_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)
header_names = st.sampled_from([
    protocol.HEADER_TIMESTAMP, protocol.HEADER_NONCE, protocol.HEADER_SIGNATURE,
    "Content-Type", "Accept", "Authorization", "Cookie", "User-Agent", "X-Forwarded-For",
    "X-Anything",
])
header_values = st.one_of(
    ascii_text,
    st.builds(lambda: f"{time.time():.6f}"),
    st.builds(protocol.new_nonce),
    st.text("0123456789abcdef", min_size=64, max_size=64),
)
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=False), st.text(max_size=20),
    st.sampled_from(["", "dg==", "MQ==", "not base64", "k", "w0"]),
)
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=5), inner, max_size=4), max_leaves=8)


def _tame(payload: dict[str, Any]) -> dict[str, Any]:
    """Keeps long-polls short: a numeric timeout becomes at most 50 ms."""
    timeout = payload.get("timeout")
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        payload["timeout"] = min(float(timeout), 0.05)
    return payload


json_objects = st.dictionaries(
    st.sampled_from(FIELDS) | st.text(max_size=8), json_values, max_size=6).map(_tame)
fuzz_keys = st.sampled_from(["k", "k2", "counter", "", "elasticrun/round1/x"])
fuzz_b64 = st.sampled_from(["", "dg==", "MQ==", "NDI=", "not base64"])
# Mostly well-typed payloads, so that signed requests also reach the handlers' happy paths.
plausible_objects = st.fixed_dictionaries({}, optional={
    "key": fuzz_keys,
    "keys": st.lists(fuzz_keys, max_size=3),
    "value": fuzz_b64,
    "expected": fuzz_b64,
    "desired": fuzz_b64,
    "amount": st.integers(-5, 5),
    "timeout": st.floats(0, 0.05),
    "worker_id": st.sampled_from(["w0", "nobody"]),
    "last_round": st.integers(-1, 3),
    "after": st.integers(-1, 3),
    "round": st.integers(-1, 3),
})
bodies = st.one_of(
    st.binary(max_size=300),
    json_objects.map(lambda d: json.dumps(d).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    plausible_objects.map(lambda d: json.dumps(d).encode()),
    plausible_objects.map(lambda d: json.dumps(d).encode()),
    plausible_objects.map(lambda d: json.dumps(d).encode()),
)
path_chars = "abcdefghijklmnopqrstuvwxyz0123456789_-/?=&%"
paths = st.one_of(
    st.sampled_from(REAL_PATHS),
    st.sampled_from(REAL_PATHS),
    st.sampled_from(REAL_PATHS),
    st.builds(lambda p, s: p + s, st.sampled_from(REAL_PATHS), st.text(path_chars, max_size=12)),
    st.builds(lambda s: "/" + s, st.text(path_chars, max_size=30)),
)
methods = st.sampled_from(["POST"] * 8 + ["GET", "PUT", "DELETE", "PATCH", "OPTIONS"])


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    method=methods,
    path=paths,
    body=bodies,
    extra_headers=st.dictionaries(header_names, header_values, max_size=4),
    signed=st.booleans(),
)
async def test_fuzz_never_5xx(
    server: Server,
    method: str,
    path: str,
    body: bytes,
    extra_headers: dict[str, str],
    signed: bool,
) -> None:
    headers = dict(extra_headers)
    if signed:
        headers.update(protocol.sign_headers(SECRET, method, path, body))
    keys_before = server.rv.store.num_keys()
    data_before = dict(server.rv.store._data)
    reply = await server.send(method, path, body, headers, timeout=10)
    event(f"{'signed' if signed else 'unsigned'} -> {reply.status}")
    assert reply.status < 500, reply
    if not signed:
        assert server.rv.store.num_keys() == keys_before
        assert dict(server.rv.store._data) == data_before
        assert reply.status in (401, 413), reply
    assert (await server.kv("num_keys"))["count"] == server.rv.store.num_keys()


async def test_server_serves_after_fuzz_like_burst(server: Server) -> None:
    """Deterministic companion of the fuzz: a burst of junk, then a valid request."""
    junk = [
        ("POST", KV + "set", b"\x00" * 100, {}),
        ("GET", "/%%%", b"", {protocol.HEADER_SIGNATURE: "0" * 64}),
        ("OPTIONS", protocol.PATH_JOIN, b"{}", {protocol.HEADER_TIMESTAMP: "-1"}),
        ("DELETE", KV + "delete", b'{"key": "k"}', {protocol.HEADER_NONCE: "n"}),
    ]
    results = await asyncio.gather(*(server.send(*j) for j in junk))
    assert all(400 <= r.status < 500 for r in results), results
    await assert_still_serving(server)


# --- 4. KV semantics ----------------------------------------------------------------------


async def test_set_get_roundtrip_binary(server: Server) -> None:
    value = bytes(range(256))
    assert await server.kv("set", key="bin", value=b64(value)) == {}
    assert server.rv.store.get("bin") == value
    assert (await server.kv("get", key="bin"))["value"] == b64(value)
    await server.kv("set", key="bin", value=b64(b""))
    assert (await server.kv("get", key="bin"))["value"] == ""


async def test_get_missing_key_times_out_with_null(server: Server) -> None:
    started = time.monotonic()
    reply = await server.kv("get", key="missing", timeout=0.5)
    elapsed = time.monotonic() - started
    assert reply == {"value": None}
    assert 0.45 <= elapsed < 2.0
    started = time.monotonic()
    assert await server.kv("get", key="missing") == {"value": None}
    assert time.monotonic() - started < 0.5


async def test_get_returns_as_soon_as_key_is_set(server: Server) -> None:
    started = time.monotonic()
    pending = asyncio.create_task(server.kv("get", key="later", timeout=10))
    await asyncio.sleep(0.2)
    assert not pending.done()
    await server.kv("set", key="later", value=b64(b"now"))
    assert (await asyncio.wait_for(pending, 5))["value"] == b64(b"now")
    assert time.monotonic() - started < 2.0


async def test_wait_long_poll_wakes_on_set(server: Server) -> None:
    started = time.monotonic()
    waiter = asyncio.create_task(server.kv("wait", keys=["a", "b"], timeout=10))
    await asyncio.sleep(0.2)
    await server.kv("set", key="a", value=b64(b"1"))
    await asyncio.sleep(0.2)
    assert not waiter.done(), "wait returned before all keys were set"
    await server.kv("set", key="b", value=b64(b"2"))
    assert await asyncio.wait_for(waiter, 5) == {"ready": True}
    assert time.monotonic() - started < 2.0


async def test_wait_times_out(server: Server) -> None:
    started = time.monotonic()
    assert await server.kv("wait", keys=["never"], timeout=0.3) == {"ready": False}
    assert 0.25 <= time.monotonic() - started < 2.0
    assert await server.kv("wait", keys=[], timeout=0.3) == {"ready": True}


async def test_add(server: Server) -> None:
    assert await server.kv("add", key="n", amount=3) == {"value": 3}
    assert await server.kv("add", key="n", amount=-10) == {"value": -7}
    assert await server.kv("add", key="n", amount=0) == {"value": -7}
    assert (await server.kv("get", key="n"))["value"] == b64(b"-7")


async def test_concurrent_adds_are_not_lost(server: Server) -> None:
    results = await asyncio.gather(*(server.kv("add", key="c", amount=1) for _ in range(50)))
    assert sorted(r["value"] for r in results) == list(range(1, 51))
    assert server.rv.store.get("c") == b"50"


async def test_compare_set(server: Server) -> None:
    # Missing key, empty expected: set.
    assert await server.kv("compare_set", key="cs", expected="", desired=b64(b"one")) == {
        "value": b64(b"one")}
    # Matching expected: swap.
    assert await server.kv(
        "compare_set", key="cs", expected=b64(b"one"), desired=b64(b"two")) == {
        "value": b64(b"two")}
    # Mismatch: unchanged, current value returned.
    assert await server.kv(
        "compare_set", key="cs", expected=b64(b"one"), desired=b64(b"three")) == {
        "value": b64(b"two")}
    assert server.rv.store.get("cs") == b"two"
    # Missing key, non-empty expected: nothing created, expected returned (torch semantics).
    assert await server.kv(
        "compare_set", key="absent", expected=b64(b"x"), desired=b64(b"y")) == {
        "value": b64(b"x")}
    assert server.rv.store.get("absent") is None


async def test_check_delete_num_keys(server: Server) -> None:
    assert await server.kv("num_keys") == {"count": 0}
    assert await server.kv("check", keys=["x", "y"]) == {"ready": False}
    await server.kv("set", key="x", value=b64(b"1"))
    await server.kv("set", key="y", value=b64(b"2"))
    assert await server.kv("check", keys=["x", "y"]) == {"ready": True}
    assert await server.kv("check", keys=[]) == {"ready": True}
    assert await server.kv("num_keys") == {"count": 2}
    assert await server.kv("delete", key="x") == {"deleted": True}
    assert await server.kv("delete", key="x") == {"deleted": False}
    assert await server.kv("check", keys=["x", "y"]) == {"ready": False}
    assert await server.kv("num_keys") == {"count": 1}
    assert (await server.kv("get", key="x"))["value"] is None


async def test_multi_get(server: Server) -> None:
    await server.kv("set", key="m1", value=b64(b"first"))
    await server.kv("set", key="m2", value=b64(b"second"))
    assert await server.kv("multi_get", keys=["m2", "m1"]) == {
        "values": [b64(b"second"), b64(b"first")]}
    assert await server.kv("multi_get", keys=["m1", "nope"], timeout=0.1) == {"values": None}
    pending = asyncio.create_task(server.kv("multi_get", keys=["m1", "m3"], timeout=10))
    await asyncio.sleep(0.2)
    assert not pending.done()
    await server.kv("set", key="m3", value=b64(b"third"))
    assert await asyncio.wait_for(pending, 5) == {"values": [b64(b"first"), b64(b"third")]}


async def test_notices_long_poll(server: Server) -> None:
    reply = await server.signed(protocol.PATH_NOTICES, {"after": 0, "timeout": 0})
    assert reply.json == {"seq": 0, "broken_round": 0, "probe": 0, "notices": []}
    started = time.monotonic()
    waiter = asyncio.create_task(server.signed(protocol.PATH_NOTICES, {"after": 0, "timeout": 10}))
    await asyncio.sleep(0.2)
    assert not waiter.done()
    assert server.rv.post_notice() == 1
    reply = (await asyncio.wait_for(waiter, 5)).json
    assert time.monotonic() - started < 2.0
    # Each notice comes with its time (whole seconds, as Horovod stamps them) and what
    # changed, for Horovod's `state._host_messages`.
    [[seq, stamp, update]] = reply.pop("notices")
    assert reply == {"seq": 1, "broken_round": 0, "probe": 0}
    assert (seq, update) == (1, int(protocol.HostUpdateResult.added))
    assert abs(stamp - time.time()) < 5
    # A worker that has seen notice 1 is not sent it again.
    reply = await server.signed(protocol.PATH_NOTICES, {"after": 1, "timeout": 0})
    assert reply.json == {"seq": 1, "broken_round": 0, "probe": 0, "notices": []}


async def test_notices_posted_by_the_machine_wake_the_long_poll(server: Server) -> None:
    """Growth: once every standby of the next round has checked in (through its join), the
    machine posts a notice, and the current round's notice long-poll answers at once."""
    slots = {SlotId("a", 0): "w0", SlotId("a", 1): "w1"}
    for slot, worker in slots.items():
        server.rv.add_worker(worker, slot)
    server.rv.open_round(1, assign([("a", 2)]), slots)
    # Discovery now lists host b too: the machine starts its worker as a standby.
    server.rv.post(ev.HostsFound({"a": 2, "b": 1}))
    [spawn] = server.rv.of(ev.Spawn)
    assert spawn.standby and spawn.slot == SlotId("b", 0)
    server.rv.post(ev.WorkerStarted(spawn.worker))
    waiter = asyncio.create_task(server.signed(protocol.PATH_NOTICES, {"after": 0, "timeout": 10}))
    standby = asyncio.create_task(
        server.signed(protocol.PATH_JOIN, {"worker_id": spawn.worker, "last_round": 0}))
    try:
        reply = await asyncio.wait_for(waiter, 5)
        assert reply.json["seq"] == 1 and reply.json["broken_round"] == 0
        assert [n[0] for n in reply.json["notices"]] == [1]
        assert [(a.seq, a.update) for a in server.rv.of(ev.PostNotice)] == [
            (1, protocol.HostUpdateResult.added)]
        assert server.rv.worker(spawn.worker).checked_in
        assert not standby.done()  # it waits for the next round
    finally:
        standby.cancel()


async def test_long_polls_end_at_their_deadline_and_leave_no_waiter_behind(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """A held request waits on a future and a timer: expired or woken, it is forgotten."""
    started = time.monotonic()
    reply = await server.signed(protocol.PATH_NOTICES, {"after": 0, "timeout": 0.3})
    assert reply.json == {"seq": 0, "broken_round": 0, "probe": 0, "notices": []}
    assert 0.25 <= time.monotonic() - started < 2.0
    assert not server.rv.rounds._changes
    waiter = asyncio.create_task(server.signed(protocol.PATH_NOTICES, {"after": 0, "timeout": 10}))
    await eventually(lambda: len(server.rv.rounds._changes) == 1)
    server.rv.post_notice()
    assert (await asyncio.wait_for(waiter, 5)).json["seq"] == 1
    assert not server.rv.rounds._changes
    monkeypatch.setattr(protocol, "MAX_POLL_S", 0.3)  # a join held past it answers "retry"
    _open_two_slot_round(server.rv)
    started = time.monotonic()
    reply = await server.signed(protocol.PATH_JOIN, {"worker_id": "w0", "last_round": 0})
    assert reply.json["action"] == "retry"
    assert 0.25 <= time.monotonic() - started < 2.0
    assert not server.rv.rounds._changes and not server.rv.rounds._joins


async def test_broken_round_releases_watchers_and_store_waiters(server: Server) -> None:
    """When a member's host fails, the machine breaks its round: the members stop waiting on
    it at once, and the next round (without the failed host) is cut."""
    key = protocol.round_prefix(3) + "gloo/rank1"
    tester_slot, lost = SlotId("tester-host", 0), SlotId("b", 0)
    server.rv.add_worker("lost", lost)
    server.rv.open_round(3, assign([("tester-host", 1), ("b", 1)]),
                         {tester_slot: TESTER, lost: "lost"})
    watcher = asyncio.create_task(
        server.signed(protocol.PATH_NOTICES, {"after": 0, "round": 3, "timeout": 20}))
    getter = asyncio.create_task(server.signed(KV + "get", {"key": key, "timeout": 20}))
    other_round = asyncio.create_task(
        server.signed(protocol.PATH_NOTICES, {"after": 0, "round": 4, "timeout": 1}))
    await asyncio.sleep(0.3)
    assert not watcher.done() and not getter.done()
    started = time.monotonic()
    server.rv.post(ev.WorkerExited("lost", 1))  # its process died: the pool's event
    assert server.rv.of(ev.BreakRound) == [ev.BreakRound(3)]
    quiet = {"seq": 0, "broken_round": 3, "probe": 0, "notices": []}
    assert (await asyncio.wait_for(watcher, 5)).json == quiet
    assert (await asyncio.wait_for(getter, 5)).status == 410
    assert time.monotonic() - started < 1.0
    # A watcher of a later round is not woken by round 3 breaking.
    assert (await asyncio.wait_for(other_round, 5)).json == quiet
    assert time.monotonic() - started >= 0.5
    # The machine cut round 4 without host b; its keys work.
    await eventually(lambda: server.rv.state.round_number == 4)
    assert server.rv.current.member_ids == {TESTER}
    assert [a.number for a in server.rv.of(ev.OpenRound)] == [4]
    await server.kv("set", key=protocol.round_prefix(4) + "x", value=b64(b"v"))
    assert (await server.kv("get", key=protocol.round_prefix(4) + "x", timeout=1))["value"]


async def test_driver_client_kv_and_refusals(server: Server) -> None:
    client = DriverClient("127.0.0.1", server.port, SECRET, unreachable_timeout=5)
    try:
        await asyncio.to_thread(client.call, KV + "set",
                                {"worker": TESTER, "key": "dc", "value": b64(b"hello")})
        assert server.rv.store.get("dc") == b"hello"
        reply = await asyncio.to_thread(client.call, KV + "get", {"worker": TESTER, "key": "dc"})
        assert reply == {"value": b64(b"hello")}
        assert await asyncio.to_thread(
            client.call, KV + "add", {"worker": TESTER, "key": "dcn", "amount": 2}) == {"value": 2}
        with pytest.raises(RequestRefusedError) as refused:
            await asyncio.to_thread(client.call, KV + "set", {"worker": TESTER, "key": "dc"})
        assert refused.value.status == 400
    finally:
        client.close()
    intruder = DriverClient("127.0.0.1", server.port, "wrong-secret", unreachable_timeout=5)
    try:
        with pytest.raises(RequestRefusedError) as refused:
            await asyncio.to_thread(
                intruder.call, KV + "set", {"worker": TESTER, "key": "dc", "value": b64(b"evil")})
        assert refused.value.status == 401
    finally:
        intruder.close()
    assert server.rv.store.get("dc") == b"hello"


# --- 5. join protocol ---------------------------------------------------------------------


def _open_two_slot_round(rv: RoundsServer, number: int = 1) -> None:
    rv.add_worker("w0", SlotId("a", 0))
    rv.add_worker("w1", SlotId("a", 1))
    rv.open_round(number, assign([("a", 2)]), {SlotId("a", 0): "w0", SlotId("a", 1): "w1"})


def _join(server: Server, worker: str, last_round: int = 0, **fields: Any) -> asyncio.Task[Reply]:
    return asyncio.create_task(server.signed(
        protocol.PATH_JOIN, {"worker_id": worker, "last_round": last_round, **fields}))


def _check_in_timers(server: Server) -> list[int]:
    """The rounds whose barrier started: the machine's check-in deadline is set then."""
    return [timer.round for timer in server.rv.timers(ev.TimerKind.CHECK_IN)]


async def test_join_barrier_and_ranks(server: Server) -> None:
    _open_two_slot_round(server.rv)
    first = _join(server, "w1")
    await eventually(lambda: _check_in_timers(server) == [1])
    await asyncio.sleep(0.3)
    assert not first.done(), "first join returned before the second worker joined"
    assert server.rv.answers() == []
    second = await server.signed(protocol.PATH_JOIN, {"worker_id": "w0", "last_round": 0})
    first_reply = await asyncio.wait_for(first, 5)
    assert first_reply.status == second.status == 200
    r1, r0 = first_reply.json, second.json
    assert (r0["action"], r0["round"]) == ("run", 1)
    assert (r1["action"], r1["round"]) == ("run", 1)
    assert r0["slot"] == {"hostname": "a", "rank": 0, "size": 2, "local_rank": 0,
                          "local_size": 2, "cross_rank": 0, "cross_size": 1}
    assert r1["slot"]["rank"] == 1 and r1["slot"]["local_rank"] == 1
    assert r1["slot"]["size"] == 2
    assert sorted((worker, reply.round, reply.slot.rank if reply.slot else None)
                  for worker, reply in server.rv.answers("run")) == [("w0", 1, 0), ("w1", 1, 1)]
    assert _check_in_timers(server) == [1]
    assert server.rv.reports("round_completed") == [{"number": 1}]
    assert server.rv.current.complete
    assert [server.rv.worker(w).joined_round for w in ("w0", "w1")] == [1, 1]


async def test_join_through_driver_client(server: Server) -> None:
    _open_two_slot_round(server.rv)
    clients = [DriverClient("127.0.0.1", server.port, SECRET, unreachable_timeout=5)
               for _ in range(2)]
    try:
        first = asyncio.create_task(asyncio.to_thread(
            clients[0].call, protocol.PATH_JOIN, {"worker_id": "w0", "last_round": 0}, 30.0))
        await eventually(lambda: _check_in_timers(server) == [1])
        await asyncio.sleep(0.2)
        assert not first.done()
        second = await asyncio.to_thread(
            clients[1].call, protocol.PATH_JOIN, {"worker_id": "w1", "last_round": 0}, 30.0)
        replies = [protocol.JoinReply.from_json(await asyncio.wait_for(first, 5)),
                   protocol.JoinReply.from_json(second)]
    finally:
        for client in clients:
            client.close()
    assert [r.action for r in replies] == ["run", "run"]
    assert [r.slot.rank for r in replies if r.slot] == [0, 1]
    assert all(r.round == 1 for r in replies)


async def test_join_unknown_worker_is_403(server: Server) -> None:
    _open_two_slot_round(server.rv)
    reply = await server.signed(protocol.PATH_JOIN, {"worker_id": "stranger", "last_round": 0})
    assert reply.status == 403
    assert server.rv.events == [] and server.rv.actions == []
    assert server.rv.current.joined == set()


async def test_join_of_a_dead_worker_is_403(server: Server) -> None:
    """A worker whose process the driver saw end is no longer known."""
    _open_two_slot_round(server.rv)
    server.rv.post(ev.WorkerExited("w0", 0))
    reply = await server.signed(protocol.PATH_JOIN, {"worker_id": "w0", "last_round": 0})
    assert reply.status == 403
    assert server.rv.of(ev.JoinAsked) == []
    assert server.rv.current.joined == set()


async def test_join_unsigned_has_no_effect(server: Server) -> None:
    _open_two_slot_round(server.rv)
    body = json.dumps({"worker_id": "w0", "last_round": 0}).encode()
    assert (await server.send("POST", protocol.PATH_JOIN, body)).status == 401
    assert server.rv.events == [] and server.rv.actions == []
    assert server.rv.current.joined == set()


async def test_join_worker_without_place_gets_exit(server: Server) -> None:
    """It is held (a last copy of the state) until the round settles, then let go."""
    _open_two_slot_round(server.rv)
    server.rv.add_worker("w2", SlotId("b", 0))
    pending = _join(server, "w2")
    members = [_join(server, "w0"), _join(server, "w1")]
    assert {r.json["action"] for r in await asyncio.wait_for(asyncio.gather(*members), 5)} \
        == {"run"}
    await asyncio.sleep(0.3)
    assert not pending.done()
    assert server.rv.worker("w2").status is WorkerStatus.RUNNING
    assert [t.round for t in server.rv.timers(ev.TimerKind.HOLD_LEAVING)] == [1]
    # Both members report holding the committed state: the round settles.
    for worker in ("w0", "w1"):
        reply = await server.signed(protocol.PATH_SYNCED, {"worker_id": worker, "round": 1})
        assert reply.status == 200
        if worker == "w0":
            await asyncio.sleep(0.2)
            assert not pending.done(), "released before every member reported its sync"
    reply = await asyncio.wait_for(pending, 5)
    assert reply.status == 200
    assert reply.json["action"] == "exit"
    assert reply.json["round"] == 1
    assert reply.json["slot"] is None
    assert server.rv.current.settled
    assert server.rv.worker("w2").status is WorkerStatus.RELEASED
    assert len(server.rv.logs("has no place")) == 1
    assert [w for w, _ in server.rv.answers("exit")] == ["w2"]


async def test_join_worker_without_place_is_let_go_after_the_hold(server: Server) -> None:
    """An unsettled round holds a worker without a place for at most start_timeout +
    collective_timeout after it opened; then the machine's timer lets it go."""
    _open_two_slot_round(server.rv)
    server.rv.current.opened_at -= 59.5  # the hold (30 s + 30 s) ends in half a second
    server.rv.add_worker("w2", SlotId("b", 0))
    started = time.monotonic()
    reply = await asyncio.wait_for(_join(server, "w2"), 5)
    assert 0.3 <= time.monotonic() - started < 3.0
    assert reply.json["action"] == "exit"
    assert not server.rv.current.settled
    assert server.rv.worker("w2").status is WorkerStatus.RELEASED


async def test_join_with_current_round_requests_reset(server: Server) -> None:
    """A member that asks for a round after the current one asks for a reset; once every
    member asked, the machine cuts the next round, and their waiting joins return."""
    _open_two_slot_round(server.rv)
    joined = await asyncio.gather(_join(server, "w0"), _join(server, "w1"))
    assert [r.json["round"] for r in joined] == [1, 1]
    started = time.monotonic()
    pending = _join(server, "w0", last_round=1, failure="peer w1 timed out")
    await eventually(lambda: "w0" in server.rv.state.resets)
    assert server.rv.state.resets["w0"].failure == "peer w1 timed out"
    await asyncio.sleep(0.2)
    assert not pending.done(), "a worker already in round 1 must wait for a newer round"
    other = await server.signed(protocol.PATH_JOIN, {"worker_id": "w1", "last_round": 1})
    reply = await asyncio.wait_for(pending, 5)
    assert reply.status == other.status == 200
    assert (reply.json["action"], reply.json["round"]) == ("run", 2)
    assert (other.json["action"], other.json["round"]) == ("run", 2)
    assert [reply.json["slot"]["rank"], other.json["slot"]["rank"]] == [0, 1]
    assert time.monotonic() - started < 5.0
    assert [a.number for a in server.rv.of(ev.OpenRound)] == [2]
    assert server.rv.current.member_ids == {"w0", "w1"}
    assert server.rv.reports("round_completed") == [{"number": 1}, {"number": 2}]


async def test_join_with_future_round_requests_reset(server: Server,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    server.rv.add_worker("w0", SlotId("a", 0))
    server.rv.open_round(1, assign([("a", 1)]), {SlotId("a", 0): "w0"})
    monkeypatch.setattr(protocol, "MAX_POLL_S", 1.0)
    pending = _join(server, "w0", last_round=7)
    # Its reset is the only one needed: the machine cuts round 2 at once...
    await eventually(lambda: server.rv.state.round_number == 2)
    assert [a.number for a in server.rv.of(ev.OpenRound)] == [2]
    # ...which is still not after round 7: the join stays held until its bound.
    reply = await asyncio.wait_for(pending, 5)
    assert reply.json["action"] == "retry"
    assert server.rv.answers() == []
    assert server.rv.current.joined == set()


async def test_released_worker_asking_again_gets_exit_again(server: Server) -> None:
    """A released worker that asks again (its exit is still on its way) is told to exit
    again, and is released only once."""
    _open_two_slot_round(server.rv)
    server.rv.add_worker("w2", SlotId("b", 0))
    server.rv.current.settled = True
    first = await asyncio.wait_for(_join(server, "w2"), 5)
    assert first.json["action"] == "exit"
    again = await asyncio.wait_for(_join(server, "w2"), 5)
    assert (again.json["action"], again.json["round"]) == ("exit", 1)
    assert len(server.rv.logs("has no place")) == 1  # released once


# --- 6. many waiters do not starve real work ----------------------------------------------


async def test_many_long_polls_do_not_starve_requests(server: Server) -> None:
    n = 300
    # One never-set key per waiter (rather than one shared key), so that the store's waiter
    # table (private, but the only observable) shows when every long-poll has arrived.
    waiters = [
        asyncio.create_task(server.kv("wait", keys=[f"never/{i}"], timeout=5))
        for i in range(n)
    ]
    try:
        # Every long-poll has reached the server once the store holds a waiter for its key.
        await eventually(lambda: len(server.rv.store._waiters) >= n, timeout=4)
        assert not any(w.done() for w in waiters)
        started = time.monotonic()
        await server.kv("set", key="work", value=b64(b"done"))
        got = await server.kv("get", key="work")
        elapsed = time.monotonic() - started
        assert got == {"value": b64(b"done")}
        assert elapsed < 1.0, f"set/get took {elapsed:.2f}s behind {n} long-polls"
        assert not any(w.done() for w in waiters), "long-polls ended early"
        results = await asyncio.wait_for(asyncio.gather(*waiters), 15)
    finally:
        for w in waiters:
            w.cancel()
    assert results == [{"ready": False}] * n


async def test_a_rounds_keys_are_its_members_only(server: Server) -> None:
    """A worker of another round (late, released, or not yet a member) cannot read or
    change a round's keys; an unknown worker cannot use the store at all."""
    a, b = SlotId("a", 0), SlotId("b", 0)
    server.rv.add_worker("wa", a)
    server.rv.add_worker("wb", b)
    server.rv.open_round(1, assign([("a", 1), ("b", 1)]), {a: "wa", b: "wb"})
    key1 = protocol.round_prefix(1) + "k"
    await server.kv("set", worker="wa", key=key1, value=b64(b"1"))
    assert (await server.signed(KV + "get", {"worker": TESTER, "key": key1})).status == 403
    assert (await server.signed(KV + "set", {"worker": "nobody", "key": "x",
                                             "value": b64(b"v")})).status == 403
    future = protocol.round_prefix(2) + "k"
    assert (await server.signed(KV + "set", {"worker": "wa", "key": future,
                                             "value": b64(b"v")})).status == 403
    # Round 2 drops b: b may no longer touch round 1 (over) nor round 2 (not a member).
    server.rv.open_round(2, assign([("a", 1)]), {a: "wa"})
    assert (await server.signed(KV + "get", {"worker": "wb", "key": key1})).status == 410
    assert (await server.signed(KV + "set", {"worker": "wb", "key": future,
                                             "value": b64(b"evil")})).status == 403
    await server.kv("set", worker="wa", key=future, value=b64(b"2"))
    assert server.rv.store.get(future) == b"2"


async def test_crowds_of_idle_slow_and_waiting_clients_do_not_starve_workers(
        server: Server) -> None:
    """1,000 idle connections, 500 clients stuck half-way through their headers and 1,000
    signed long-poll waiters: a real round still forms, and its members' calls stay fast."""
    idle, slow = [], []
    for _ in range(1000):
        idle.append(await asyncio.open_connection("127.0.0.1", server.port))
    for _ in range(500):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /v1/kv/set HTTP/1.1\r\nHost: x\r\nContent-Len")  # and stalls
        slow.append((reader, writer))
    waiters = [asyncio.create_task(server.signed(
        protocol.PATH_NOTICES, {"after": 0, "timeout": 30}, timeout=60)) for _ in range(1000)]
    await asyncio.sleep(1.0)
    clients: list[DriverClient] = []
    try:
        slots = {SlotId("a", 0): "w0", SlotId("a", 1): "w1"}
        for slot, worker in slots.items():
            server.rv.add_worker(worker, slot)
        server.rv.open_round(1, assign([("a", 2)]), slots)
        clients = [DriverClient("127.0.0.1", server.port, SECRET, unreachable_timeout=5)
                   for _ in slots.values()]

        def member(index: int) -> float:
            started = time.monotonic()
            client, worker = clients[index], f"w{index}"
            reply = client.call(protocol.PATH_JOIN, {"worker_id": worker, "last_round": 0},
                                wait=protocol.MAX_POLL_S)
            assert reply["action"] == "run", reply
            key = protocol.round_prefix(1) + f"rank{index}"
            client.call(KV + "set", {"worker": worker, "key": key, "value": b64(b"x")})
            other = protocol.round_prefix(1) + f"rank{1 - index}"
            client.call(KV + "get", {"worker": worker, "key": other, "timeout": 10}, wait=10)
            return time.monotonic() - started

        took = await asyncio.gather(*(asyncio.to_thread(member, i) for i in range(2)))
        assert max(took) < 2.0, took
        assert not any(w.done() for w in waiters)  # still waiting, not dropped
        server.rv.post_notice()
        replies = await asyncio.wait_for(asyncio.gather(*waiters), 30)
        assert {r.status for r in replies} == {200}
    finally:
        for client in clients:
            client.close()
        for _, writer in idle + slow:
            writer.close()


async def test_a_failure_report_breaks_the_round_of_the_failing_worker(server: Server) -> None:
    _open_two_slot_round(server.rv)
    server.rv.add_worker("b0", SlotId("b", 0))
    reply = await server.signed(protocol.PATH_FAILING,
                                {"worker_id": "w1", "failure": "ValueError: bad batch"})
    assert reply.status == 200
    reported = lambda: [e for e in server.rv.events  # noqa: E731 - not the cut's timer
                        if not isinstance(e, ev.TimerFired)]
    assert reported() == [ev.WorkerFailing("w1", "ValueError: bad batch")]
    assert server.rv.state.broken_round == 1
    assert [f.cause for f in server.rv.of(ev.RecordFailure)] == [
        "rank 1 on host a failed: ValueError: bad batch"]
    reply = await server.signed(protocol.PATH_FAILING, {"worker_id": "nobody", "failure": "x"})
    assert reply.status == 403
    for bad in (b'{"worker_id": "w0"}', b'{"worker_id": "w0", "failure": 3}'):
        assert (await server.signed(protocol.PATH_FAILING, body=bad)).status == 400, bad
    assert len(reported()) == 1


async def test_sync_reports_reach_the_driver(server: Server) -> None:
    server.rv.add_worker("w0", SlotId("a", 0))
    reply = await server.signed(protocol.PATH_SYNCED, {"worker_id": "w0", "round": 3})
    assert reply.status == 200
    assert server.rv.events == [ev.WorkerSynced("w0", 3)]
    assert server.rv.worker("w0").synced_round == 3
    assert server.rv.state.state_committed
    reply = await server.signed(protocol.PATH_SYNCED, {"worker_id": "nobody", "round": 3})
    assert reply.status == 403
    assert (await server.send("POST", protocol.PATH_SYNCED,
                              b'{"worker_id": "w0", "round": 4}')).status == 401
    for bad in (b'{"worker_id": "w0"}', b'{"worker_id": "w0", "round": "4"}',
                b'{"worker_id": 0, "round": 4}', b'{"worker_id": "w0", "round": true}'):
        assert (await server.signed(protocol.PATH_SYNCED, body=bad)).status == 400, bad
    assert server.rv.events == [ev.WorkerSynced("w0", 3)]
    assert server.rv.worker("w0").synced_round == 3


# --- 7. rounds of many workers --------------------------------------------------------------


async def test_round_completes_exactly_when_its_last_member_joins(server: Server) -> None:
    """Repeated joins of one member and joins of a worker with no place do not count: the
    round completes once, when the last distinct member joins, and not a join earlier."""
    slots = {SlotId(host, i): f"{host}{i}" for host in "ab" for i in range(2)}
    for slot, worker in slots.items():
        server.rv.add_worker(worker, slot)
    server.rv.open_round(1, assign([("a", 2), ("b", 2)]), slots)
    server.rv.add_worker("standby", SlotId("c", 0), standby=True)  # for a later round

    def join(worker: str) -> asyncio.Task[Reply]:
        return asyncio.create_task(
            server.signed(protocol.PATH_JOIN, {"worker_id": worker, "last_round": 0}))

    early = [join(w) for w in ("a0", "a1", "b0")]
    standby = join("standby")
    try:
        await eventually(lambda: server.rv.worker("standby").checked_in)
        await eventually(lambda: server.rv.current.joined == {"a0", "a1", "b0"})
        again = [join(w) for w in ("a0", "a1")]  # asked again (the first asks superseded)
        await eventually(lambda: len(server.rv.of(ev.JoinAsked)) == 6)
        await asyncio.sleep(0.3)
        assert server.rv.reports("round_completed") == []
        assert not server.rv.current.complete
        assert not any(task.done() for task in again)
        last = await server.signed(protocol.PATH_JOIN, {"worker_id": "b1", "last_round": 0})
        replies = [r.json for r in await asyncio.wait_for(asyncio.gather(early[2], *again), 5)]
        replies.append(last.json)
    finally:
        standby.cancel()
        for task in early:
            task.cancel()
    assert all((r["action"], r["round"]) == ("run", 1) for r in replies)
    assert [r["slot"]["rank"] for r in replies] == [2, 0, 1, 3]
    assert server.rv.reports("round_completed") == [{"number": 1}]
    assert _check_in_timers(server) == [1]
    assert server.rv.current.complete
    assert "standby" not in [worker for worker, _ in server.rv.answers()]  # waits on


async def test_a_superseded_join_is_answered_too(server: Server) -> None:
    """A join asked again while the first is held (a client that retried after a dropped
    connection) must not leave the first hanging for 30 s: it is told to retry."""
    _open_two_slot_round(server.rv)
    first = _join(server, "w0")
    await eventually(lambda: len(server.rv.of(ev.JoinAsked)) == 1)
    second = _join(server, "w0")
    await eventually(lambda: len(server.rv.of(ev.JoinAsked)) == 2)
    await server.signed(protocol.PATH_JOIN, {"worker_id": "w1", "last_round": 0})
    try:
        assert (await asyncio.wait_for(second, 5)).json["action"] == "run"
        reply = await asyncio.wait_for(first, 5)
        assert reply.json["action"] == "retry"
    finally:
        first.cancel()


async def test_a_crowd_of_workers_forms_one_round_and_uses_its_keys(server: Server) -> None:
    """300 workers join at once: each gets its own rank; then each sets its key in the round
    and reads its neighbour's (the store's membership check, for every one of them)."""
    n, prefix = 300, protocol.round_prefix(1)
    assignment = assign([(f"h{h}", 10) for h in range(n // 10)])
    members = {slot: f"w{info.rank}" for slot, info in assignment.items()}
    for slot, worker in members.items():
        server.rv.add_worker(worker, slot)
    server.rv.open_round(1, assignment, members)
    replies = await asyncio.gather(*(server.signed(
        protocol.PATH_JOIN, {"worker_id": f"w{i}", "last_round": 0}) for i in range(n)))
    assert [(r.status, r.json["action"], r.json["slot"]["rank"]) for r in replies] == [
        (200, "run", i) for i in range(n)]
    assert server.rv.reports("round_completed") == [{"number": 1}]
    assert len(server.rv.answers("run")) == n
    await asyncio.gather(*(server.kv("set", worker=f"w{i}", key=f"{prefix}{i}",
                                     value=b64(str(i).encode())) for i in range(n)))
    got = await asyncio.gather(*(server.kv("get", worker=f"w{i}", key=f"{prefix}{(i + 1) % n}")
                                 for i in range(n)))
    assert got == [{"value": b64(str((i + 1) % n).encode())} for i in range(n)]


async def test_a_stall_report_probes_the_members_and_their_next_polls_answer(
        server: Server) -> None:
    """Hang detection through the real server: a member's stall report (a machine event)
    ends every member's held notice poll with the new probe; a poll acknowledging it, with
    the worker's liveness, is the member's answer; later polls are held again."""
    slots = {SlotId("a", 0): "w0", SlotId("a", 1): "w1"}
    for slot, worker in slots.items():
        server.rv.add_worker(worker, slot)
    server.rv.open_round(5, assign([("a", 2)]), slots)
    server.rv.current.joined.update(slots.values())
    server.rv.current.complete = True
    held = asyncio.create_task(server.signed(protocol.PATH_NOTICES, {
        "after": 0, "round": 5, "timeout": 10, "worker_id": "w1", "probe_ack": 0}))
    await asyncio.sleep(0.2)
    assert not held.done()
    report = await server.signed(protocol.PATH_STALLED,
                                 {"worker_id": "w0", "round": 5, "waited_s": 0.3})
    assert report.status == 200
    [stalled] = server.rv.of(ev.WorkerStalled)
    assert stalled == ev.WorkerStalled("w0", 5, 0.3)
    probe = (await asyncio.wait_for(held, 5)).json["probe"]
    assert probe == server.rv.state.probe_seq > 0
    liveness = {"in_collective": True, "since_s": 0.4, "cpu_s": 1.5}
    answer = asyncio.create_task(server.signed(protocol.PATH_NOTICES, {
        "after": 0, "round": 5, "timeout": 0.5, "worker_id": "w1", "probe_ack": probe,
        "liveness": liveness}))
    assert (await asyncio.wait_for(answer, 5)).json["probe"] == probe  # held, then expired
    assert server.rv.of(ev.ProbeAnswered) == [
        ev.ProbeAnswered("w1", 5, probe, True, 0.4, 1.5)]
    stall = server.rv.state.stall
    assert stall is not None and stall.answered == {"w0", "w1"}
    bad = await server.signed(protocol.PATH_NOTICES, {
        "after": 0, "round": 5, "timeout": 0, "worker_id": "w1", "probe_ack": probe,
        "liveness": {"in_collective": "yes"}})
    assert bad.status == 400
    unknown = await server.signed(protocol.PATH_STALLED,
                                  {"worker_id": "nobody", "round": 5, "waited_s": 1})
    assert unknown.status == 403
