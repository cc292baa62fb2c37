"""Rendezvous at scale: N simulated workers against the driver's real rendezvous server.

The server (scripts/rendezvous_server.py, its own process, so the clients' CPU is not in
its event loop) is the real `WorkerServer` in front of the real `RoundMachine`, with
round 1 open for N workers on N/8 hosts of 8 slots. The clients are lean: asyncio streams
speaking HTTP/1.1 by hand, one keep-alive connection per worker, sending the real signed
requests (no torch, no aiohttp client, whose per-request CPU on a 4096-worker round would
outweigh the server's).

round   every worker POSTs its join at once; the server holds each until the last member
        has joined, then all get "run". Time from the first join sent to the last "run"
        received (connection set-up included), and join requests per second.
store   what follows in a real job: each worker sets its own key under round 1's prefix
        and gets (long-polls) another member's. Time from the first request to the last
        reply, and requests per second.

Every reply is checked: all "run" in round 1, worker wI at rank I (so ranks 0..N-1 are
distinct), every get the value its owner set. Also reported: the CPU seconds the server
spent in each phase, which (unlike the wall times) the other work on a shared machine does
not blur; the raw numbers also hold the clients' CPU seconds (the clients and the server
share this machine's cores).
"""

from __future__ import annotations

import asyncio
import base64
import json
import resource
import subprocess
import time
from typing import Any

from benchlib import PYTHON, SCRIPTS, bench_env, print_table, summarize

from elasticrun import protocol

SERVER = SCRIPTS / "rendezvous_server.py"
SIZES = [64, 256, 1024, 4096]
QUICK_SIZES = [64]
STORE_KEY = protocol.round_prefix(1) + "bench/"
PHASE_TIMEOUT_S = 120.0  # a hung phase fails the run


def raise_fd_limit() -> None:
    """One socket per simulated worker: 4096 of them need more than the usual 1024 fds."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Connection:
    """One keep-alive HTTP/1.1 connection to the server, opened on first use (and again
    after the server answers "Connection: close")."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._host = f"Host: 127.0.0.1:{port}\r\n"
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self._port)
        reader, writer = self._reader, self._writer
        assert reader is not None
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        writer.write(f"POST {path} HTTP/1.1\r\n{self._host}Content-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n{extra}\r\n".encode() + body)
        await writer.drain()
        status_line, *lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split(
            "\r\n")
        version, status, *_ = status_line.split(" ", 2)
        if not version.startswith("HTTP/1."):
            raise RuntimeError(f"not an HTTP/1.x reply: {status_line!r}")
        fields = {}
        for line in lines:
            if line:
                name, _, value = line.partition(":")
                fields[name.strip().lower()] = value.strip()
        close = fields.get("connection", "").lower() == "close"
        if "content-length" in fields:
            data = await reader.readexactly(int(fields["content-length"]))
        elif close and "transfer-encoding" not in fields:
            data = await reader.read()  # the body runs to the end of the connection
        else:
            raise RuntimeError(f"reply without Content-Length: {fields}")
        if close:
            writer.close()
            self._reader = self._writer = None
        return int(status), data

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._reader = self._writer = None


class Worker:
    """One simulated worker: wI, speaking the real protocol over its own connection."""

    def __init__(self, index: int, workers: int, port: int, secret: str) -> None:
        self.index, self.workers = index, workers
        self.worker_id = f"w{index}"
        self.connection, self._secret = Connection(port), secret
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


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class Server:
    """scripts/rendezvous_server.py in its own process, round 1 open for N workers."""

    def __init__(self, workers: int, secret: str) -> None:
        self._proc = subprocess.Popen([PYTHON, str(SERVER), str(workers)],
                                      env=bench_env({protocol.ENV_SECRET: secret}),
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self._read()
        if not line.isdigit():
            self._proc.kill()
            self._proc.wait()
            raise RuntimeError(f"the rendezvous server did not start (said {line!r})")
        self.port = int(line)

    def _read(self) -> str:
        assert self._proc.stdout is not None
        return self._proc.stdout.readline().strip()

    def cpu_since_last(self) -> float:
        """The CPU seconds the server spent since the last call (or since it started).
        Blocking: called between phases, when no request is in flight."""
        assert self._proc.stdin is not None
        self._proc.stdin.write("\n")
        self._proc.stdin.flush()
        return float(self._read())

    def close(self) -> None:
        self._proc.communicate(timeout=60)  # closes its stdin: the cue to exit
        if self._proc.returncode != 0:
            raise RuntimeError(f"the rendezvous server failed (exit {self._proc.returncode})")


async def run_clients(workers: int, server: Server, secret: str) -> dict[str, float]:
    fleet = [Worker(i, workers, server.port, secret) for i in range(workers)]
    try:
        server.cpu_since_last()
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.wait_for(asyncio.gather(*(w.join() for w in fleet)), PHASE_TIMEOUT_S)
        round_s, client_round_s = time.perf_counter() - start, time.process_time() - cpu
        round_cpu_s = server.cpu_since_last()
        joins = sum(w.requests for w in fleet)
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.wait_for(asyncio.gather(*(w.store() for w in fleet)), PHASE_TIMEOUT_S)
        store_s, client_store_s = time.perf_counter() - start, time.process_time() - cpu
        store_cpu_s = server.cpu_since_last()
        store_requests = sum(w.requests for w in fleet) - joins
    finally:
        for worker in fleet:
            worker.connection.close()
    return {"round_s": round_s, "join_req_per_s": joins / round_s,
            "store_s": store_s, "store_req_per_s": store_requests / store_s,
            "server_cpu_round_s": round_cpu_s, "server_cpu_store_s": store_cpu_s,
            "client_cpu_round_s": client_round_s, "client_cpu_store_s": client_store_s,
            "joins": joins, "store_requests": store_requests}


def trial(workers: int) -> dict[str, float]:
    secret = protocol.new_secret()
    server = Server(workers, secret)
    try:
        return asyncio.run(run_clients(workers, server, secret))
    finally:
        server.close()


def bench(trials: int, quick: bool) -> dict[str, Any]:
    raise_fd_limit()
    table: dict[str, Any] = {}
    rows = []
    for workers in QUICK_SIZES if quick else SIZES:
        runs = [trial(workers) for _ in range(trials)]
        median = summarize(runs)
        table[str(workers)] = {"trials": runs, "median": median}
        rows.append([workers, median["round_s"], median["join_req_per_s"], median["store_s"],
                     median["store_req_per_s"], median["server_cpu_round_s"],
                     median["server_cpu_store_s"]])
    print_table(f"rendezvous: N workers join round 1, then set + get a key; median of {trials}",
                ["N", "round s", "join req/s", "store s", "store req/s", "srv cpu round s",
                 "srv cpu store s"], rows)
    return table
