"""The lean clients of benchmarks/rendezvous_scale.py (and liveness_scale.py): simulated
workers speaking the driver's real, signed protocol over hand-written HTTP/1.1, one
keep-alive connection each, from their simulated host's own loopback address."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import resource
import socket
import struct
from typing import Any

from elasticrun import protocol

STORE_KEY = protocol.round_prefix(1) + "bench/"
SLOTS_PER_HOST = 8
IP_BIND_ADDRESS_NO_PORT = 24  # Linux: bind() leaves the port to connect() (socket.h)


def raise_fd_limit() -> None:
    """One socket per simulated worker: 4096 of them need more than the usual 1024 fds."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def pace_collector() -> None:
    """The clients hold 16,384 connections in one process (a real worker holds one): the
    collector's pace of the driver (elasticrun/driver/server/gc_policy.py), so that the
    clients' full collections do not stand for the server's cost."""
    gc.set_threshold(50_000, *gc.get_threshold()[1:])
    gc.freeze()


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to the server, opened on first use (and again
    after the server answers "Connection: close"). A bare protocol, not asyncio streams:
    16,384 simulated workers share this machine's cores with the server, and the streams'
    reader, writer and drain per request cost more CPU than the server's answer."""

    def __init__(self, port: int, source: str) -> None:
        self._port, self._source = port, source
        self._host = f"Host: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._reply: asyncio.Future[tuple[int, bytes]] | None = None

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        loop = asyncio.get_running_loop()
        if self._transport is None:
            await self._connect(loop)
        assert self._transport is not None
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        self._reply = reply = loop.create_future()
        self._transport.write(f"POST {path} HTTP/1.1\r\n{self._host}"
                              f"Content-Length: {len(body)}\r\n{extra}\r\n".encode() + body)
        return await reply

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> None:
        """From this worker's host's own address, as on a cluster: from one address, each
        connect's search for a free port passes every port taken, O(N^2) in all."""
        sock = socket.socket()
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
            sock.bind((self._source, 0))
            await loop.sock_connect(sock, ("127.0.0.1", self._port))
            await loop.create_connection(lambda: self, sock=sock)
        except BaseException:
            sock.close()
            raise

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._buffer.clear()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        self._parse(at_eof=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._reply is not None and not self._reply.done():
            self._parse(at_eof=True)
        if self._reply is not None and not self._reply.done():
            self._reply.set_exception(ConnectionError(f"the server closed the connection: {exc}"))

    def _parse(self, at_eof: bool) -> None:
        """Settles the pending reply once all of it has arrived."""
        buffer = self._buffer
        end = buffer.find(b"\r\n\r\n")
        if end < 0 or self._reply is None:
            return
        status_line, *lines = buffer[:end].decode("latin-1").split("\r\n")
        version, status, *_ = status_line.split(" ", 2)
        if not version.startswith("HTTP/1."):
            self._reply.set_exception(RuntimeError(f"not an HTTP/1.x reply: {status_line!r}"))
            return
        fields = {}
        for line in lines:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        close = fields.get("connection", "").lower() == "close"
        if "content-length" in fields:
            stop = end + 4 + int(fields["content-length"])
            if len(buffer) < stop:
                return
        elif close and "transfer-encoding" not in fields:
            if not at_eof:
                return  # the body runs to the end of the connection
            stop = len(buffer)
        else:
            self._reply.set_exception(RuntimeError(f"reply without Content-Length: {fields}"))
            return
        data = bytes(buffer[end + 4:stop])
        del buffer[:stop]
        self._reply.set_result((int(status), data))
        if close and self._transport is not None:
            self._transport.close()
            self._transport = None

    def close(self) -> None:
        """Resets the connection: closed normally, each of 16,384 would hold its port in
        TIME_WAIT for a minute, and the next trial's connects would run out of ports."""
        if self._transport is not None:
            sock = self._transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self._transport.close()
            self._transport = None


class Worker:
    """One simulated worker: wI, speaking the real protocol over its own connection."""

    def __init__(self, index: int, workers: int, port: int, secret: str) -> None:
        self.index, self.workers = index, workers
        self.worker_id = f"w{index}"
        self.connection, self._secret = Connection(port, host_address(index)), secret
        self.requests = 0

    async def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps(payload).encode()
        headers = protocol.sign_headers(self._secret, "POST", path, body)  # a fresh nonce
        self.requests += 1
        status, data = await self.connection.post(path, body, headers)
        if status != 200:
            raise RuntimeError(f"{self.worker_id} {path}: HTTP {status} {data[:200]!r}")
        result = json.loads(data)
        assert isinstance(result, dict)
        return result

    async def join(self) -> None:
        """A "retry" (the server held the join for 30 s) fails the benchmark too."""
        reply = await self.post(protocol.PATH_JOIN, {"worker_id": self.worker_id, "last_round": 0})
        rank = (reply.get("slot") or {}).get("rank")
        if reply["action"] != "run" or reply["round"] != 1 or rank != self.index:
            raise RuntimeError(f"{self.worker_id} expected run at rank {self.index}: {reply}")

    async def store(self) -> None:
        await self.post(protocol.PATH_KV_PREFIX + "set", {
            "worker": self.worker_id, "key": STORE_KEY + self.worker_id,
            "value": _b64(self.worker_id)})
        peer = f"w{(self.index + 1) % self.workers}"
        reply = await self.post(protocol.PATH_KV_PREFIX + "get", {
            "worker": self.worker_id, "key": STORE_KEY + peer, "timeout": 30.0})
        if reply["value"] != _b64(peer):
            raise RuntimeError(f"{self.worker_id} got {reply['value']!r} for {peer}'s key")


def host_address(index: int) -> str:
    """The loopback address of worker wI's simulated host (8 slots a host, as the server's):
    127.1.0.1, 127.1.0.2, ..."""
    host = index // SLOTS_PER_HOST
    return f"127.1.{host // 250}.{host % 250 + 1}"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
