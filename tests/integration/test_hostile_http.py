"""Outsiders on the driver's port (issue 55, findings 2 and 4): unsigned bodies are never
buffered, compressed ones never inflated, stalled headers and idle connections are cut,
each address holds a bounded number of unauthenticated connections, and no error page
quotes what the client sent. Loopback only."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from elasticrun import protocol
from elasticrun.driver.rounds.assignment import SlotId
from elasticrun.driver.server import connections
from tests.rounds_server import RoundsServer

pytestmark = pytest.mark.timeout(60)
SECRET = "ab" * 32
KV_SET = protocol.PATH_KV_PREFIX + "set"
ROOT = Path(__file__).resolve().parents[2]
# A driver's server alone in a process of its own, so that its RSS is the server's.
SERVER_SCRIPT = f"""
import asyncio, sys
sys.path.insert(0, {str(ROOT)!r})
from tests.rounds_server import RoundsServer
async def main():
    server = RoundsServer({SECRET!r})
    print(await server.start(), flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


@pytest_asyncio.fixture
async def server() -> AsyncIterator[RoundsServer]:
    rv = RoundsServer(SECRET)
    await rv.start()
    try:
        yield rv
    finally:
        await rv.stop()


@pytest.fixture
def server_process() -> Iterator[tuple[int, int]]:
    process = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT], stdout=subprocess.PIPE,
                               cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield process.pid, port
    finally:
        process.kill()
        process.wait(timeout=10)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


async def post_raw(port: int, head: bytes, body: bytes, hold_s: float) -> None:
    """Sends `head`, then `body` as fast as the server takes it, for up to `hold_s`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        writer.write(body)
        await asyncio.wait_for(writer.drain(), hold_s)
        await asyncio.wait_for(reader.read(), hold_s)
    except (TimeoutError, ConnectionError):
        pass
    finally:
        writer.close()


async def peak_rss(pid: int, work: asyncio.Future[object]) -> float:
    peak = rss_mib(pid)
    while not work.done():
        peak = max(peak, rss_mib(pid))
        await asyncio.sleep(0.02)
    return max(peak, rss_mib(pid))


def post_head(length: int, extra: bytes = b"") -> bytes:
    return (f"POST {KV_SET} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n").encode() + extra + b"\r\n"


# --- authentication before buffering (finding 2) ---------------------------------------------


async def test_unsigned_large_bodies_are_not_buffered(server_process: tuple[int, int]) -> None:
    """40 concurrent unsigned 4 MB POSTs: the server's RSS stays near idle (it grew by
    ~140 MiB when bodies were read before their signature was checked)."""
    pid, port = server_process
    await asyncio.sleep(0.3)
    idle = rss_mib(pid)
    body = b"A" * protocol.MAX_BODY_BYTES
    work = asyncio.ensure_future(asyncio.gather(*(
        post_raw(port, post_head(len(body)), body, hold_s=5.0) for _ in range(40))))
    peak = await peak_rss(pid, work)
    print(f"idle {idle:.1f} MiB, peak {peak:.1f} MiB under 40 unsigned 4 MB POSTs")
    assert peak - idle < 30, (idle, peak)


async def test_gzip_bomb_is_refused_uninflated(server_process: tuple[int, int]) -> None:
    pid, port = server_process
    bomb = gzip.compress(b"{" + b" " * (100 * 1024 * 1024) + b"}", 9)  # ~100 KB
    await asyncio.sleep(0.3)
    idle = rss_mib(pid)
    for headers in (protocol.sign_headers(SECRET, "POST", KV_SET, bomb), {}):
        extra = b"Content-Encoding: gzip\r\n" + b"".join(
            f"{k}: {v}\r\n".encode() for k, v in headers.items())
        work = asyncio.ensure_future(post_raw(port, post_head(len(bomb), extra), bomb, 5.0))
        peak = await peak_rss(pid, work)
        assert peak - idle < 10, (idle, peak)
    status = await first_status(port, post_head(len(bomb), b"Content-Encoding: gzip\r\n") + bomb)
    assert status.startswith(b"HTTP/1.1 415")


async def first_status(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        return await asyncio.wait_for(reader.readline(), 5.0)
    finally:
        writer.close()


async def test_refused_request_closes_its_connection_unread(server: RoundsServer) -> None:
    """The 401 comes before the body is sent at all, on a connection the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(post_head(protocol.MAX_BODY_BYTES))  # and not one byte of the body
        answer = await asyncio.wait_for(reader.read(), 5.0)  # read() ends: closed
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 401")
    assert b"Connection: close" in answer


async def test_signed_body_must_match_its_digest(server: RoundsServer) -> None:
    server.add_worker("w", SlotId("h", 0))
    body = json.dumps({"worker": "w", "key": "k", "value": "dg=="}).encode()
    other = json.dumps({"worker": "w", "key": "k", "value": "eA=="}).encode()
    headers = protocol.sign_headers(SECRET, "POST", KV_SET, body)
    extra = b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items())
    swapped = await first_status(server.port, post_head(len(other), extra) + other)
    assert swapped.startswith(b"HTTP/1.1 401")
    # The nonce was not spent by the swapped body: the real request still passes.
    real = await first_status(server.port, post_head(len(body), extra) + body)
    assert real.startswith(b"HTTP/1.1 200"), real
    replay = await first_status(server.port, post_head(len(body), extra) + body)
    assert replay.startswith(b"HTTP/1.1 401")
    assert server.store.get("k") == b"v"


# --- bounded reads (finding 4) ----------------------------------------------------------------


async def wait_closed(reader: asyncio.StreamReader, within_s: float) -> float:
    started = time.monotonic()
    assert await asyncio.wait_for(reader.read(), within_s) == b""
    return time.monotonic() - started


async def test_half_headers_are_cut_within_the_bound(
        server: RoundsServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections, "HEADER_TIMEOUT_S", 1.0)
    sockets = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(10)]
    try:
        for _, writer in sockets:
            writer.write(b"POST /v1/kv/set HTTP/1.1\r\nHost: x\r\nContent-Len")
        waited = await asyncio.gather(*(wait_closed(reader, 5.0) for reader, _ in sockets))
    finally:
        for _, writer in sockets:
            writer.close()
    assert max(waited) < 4.0, waited


async def test_silent_connection_is_cut(server: RoundsServer,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections, "HEADER_TIMEOUT_S", 1.0)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        assert await wait_closed(reader, 5.0) < 4.0
    finally:
        writer.close()


async def test_idle_keepalive_connection_is_closed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(connections.HANDLER_ARGS, "keepalive_timeout", 1.0)
    rv = RoundsServer(SECRET)
    await rv.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", rv.port)
        writer.write(b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await asyncio.wait_for(reader.readline(), 5.0)).startswith(b"HTTP/1.1 ")
        started = time.monotonic()
        await asyncio.wait_for(reader.read(), 5.0)  # the 404's body, then the close
        assert time.monotonic() - started < 4.0
        writer.close()
    finally:
        await rv.stop()


async def test_unauthenticated_connections_per_address_are_capped(
        server: RoundsServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the cap, an address's oldest unauthenticated connections are closed; a worker's
    signed requests still pass (a new connection is the youngest)."""
    monkeypatch.setattr(connections, "MAX_UNTRUSTED_PER_PEER", 5)
    held = []
    for _ in range(8):
        held.append(await asyncio.open_connection("127.0.0.1", server.port))
        await asyncio.sleep(0.02)
    try:
        for reader, _ in held[:3]:
            assert await asyncio.wait_for(reader.read(), 5.0) == b""
        for reader, _ in held[3:]:
            assert not reader.at_eof()
        server.add_worker("w", SlotId("h", 0))
        body = json.dumps({"worker": "w"}).encode()
        path = protocol.PATH_KV_PREFIX + "num_keys"
        extra = b"".join(f"{k}: {v}\r\n".encode()
                         for k, v in protocol.sign_headers(SECRET, "POST", path, body).items())
        head = post_head(len(body), extra).replace(KV_SET.encode(), path.encode())
        assert (await first_status(server.port, head + body)).startswith(b"HTTP/1.1 200")
    finally:
        for _, writer in held:
            writer.close()


@pytest.mark.parametrize("request_bytes", [
    b"GET /status HTTP/1.1\r\nHost: x\r\nAuthorization: secret-MARKER\x01\r\n\r\n",
    b"GET /secret-MARKER\x01 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"PO\x01ST-MARKER / HTTP/1.1\r\nHost: x\r\n\r\n",
])
async def test_error_pages_echo_nothing(server: RoundsServer, request_bytes: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(request_bytes)
        answer = await asyncio.wait_for(reader.read(), 5.0)
    finally:
        writer.close()
    assert answer.split(b" ", 2)[1] == b"400", answer
    assert b"MARKER" not in answer and b"secret" not in answer


async def test_the_servers_connections_are_guarded(server: RoundsServer) -> None:
    """aiohttp makes them through a private method (AppRunner._make_server): if it stops
    calling it, this fails instead of every bound silently going away."""
    _, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        runner = server.server._runner
        assert runner is not None and runner.server is not None
        deadline = time.monotonic() + 5.0
        while not runner.server.connections:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert all(isinstance(c, connections.GuardedConnection)
                   for c in runner.server.connections)
    finally:
        writer.close()


@pytest.mark.parametrize("request_bytes", [
    # Content-Length and chunked together (request smuggling)
    b"POST /v1/rendezvous/join HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    # two Content-Lengths that disagree
    b"POST /v1/rendezvous/join HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
    b"Content-Length: 40\r\n\r\nabcd",
    # a chunk size that is no number, and one beyond any body
    b"POST /v1/rendezvous/join HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"zz\r\nabcd\r\n0\r\n\r\n",
    b"POST /v1/rendezvous/join HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"ffffffffffffffffffff\r\n",
    # a negative length, a bare LF line ending, an obsolete line folding
    b"POST /v1/rendezvous/join HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"POST /v1/rendezvous/join HTTP/1.1\nHost: x\nContent-Length: 0\n\n",
    b"GET /status HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n",
], ids=["cl-and-chunked", "two-lengths", "bad-chunk", "huge-chunk", "negative-length",
        "bare-lf", "folded-header"])
async def test_framing_tricks_get_a_4xx_and_the_server_goes_on(
        server: RoundsServer, request_bytes: bytes) -> None:
    status = await first_status(server.port, request_bytes)
    code = status.split(b" ", 2)[1] if status.count(b" ") >= 2 else b""
    assert status == b"" or code.startswith(b"4"), status  # refused, or the connection cut
    after = await first_status(server.port, b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
    assert after.startswith(b"HTTP/1.1 4"), after  # it still answers (this one unsigned)
