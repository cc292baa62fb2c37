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

floor   the same joins against a bare aiohttp server (scripts/aiohttp_floor_server.py) that
        only reads each body and holds it until the last arrives: aiohttp's and asyncio's
        own cost, which no aiohttp server can go below.

Every reply is checked: all "run" in round 1, worker wI at rank I (so ranks 0..N-1 are
distinct), every get the value its owner set. Also reported: the CPU seconds the server
spent in each phase, which (unlike the wall times) the other work on a shared machine does
not blur; the raw numbers also hold the clients' CPU seconds (the clients and the server
share this machine's cores).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

from benchlib import PYTHON, SCRIPTS, bench_env, print_table, summarize

# liveness_scale.py imports Worker, pace_collector and raise_fd_limit from this module.
from rendezvous_clients import Worker, pace_collector, raise_fd_limit

from elasticrun import protocol

SERVER = SCRIPTS / "rendezvous_server.py"
FLOOR = SCRIPTS / "aiohttp_floor_server.py"  # a bare aiohttp barrier: the floor
SIZES = [64, 256, 1024, 4096, 16384]
QUICK_SIZES = [64]
PHASE_TIMEOUT_S = 120.0  # a hung phase fails the run


class Server:
    """scripts/rendezvous_server.py in its own process, round 1 open for N workers."""

    def __init__(self, workers: int, secret: str, script: Path = SERVER) -> None:
        self._proc = subprocess.Popen([PYTHON, str(script), str(workers)],
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


async def run_clients(workers: int, server: Server, secret: str, store: bool = True
                      ) -> dict[str, float]:
    fleet = [Worker(i, workers, server.port, secret) for i in range(workers)]
    try:
        server.cpu_since_last()
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.wait_for(asyncio.gather(*(w.join() for w in fleet)), PHASE_TIMEOUT_S)
        round_s, client_round_s = time.perf_counter() - start, time.process_time() - cpu
        round_cpu_s = server.cpu_since_last()
        joins = sum(w.requests for w in fleet)
        if not store:
            return {"round_s": round_s, "server_cpu_round_s": round_cpu_s,
                    "client_cpu_round_s": client_round_s}
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
        result = asyncio.run(run_clients(workers, server, secret))
    finally:
        server.close()
    floor = Server(workers, secret, FLOOR)
    try:
        bare = asyncio.run(run_clients(workers, floor, secret, store=False))
    finally:
        floor.close()
    return {**result, **{f"floor_{name}": value for name, value in bare.items()}}


def bench(trials: int, quick: bool) -> dict[str, Any]:
    raise_fd_limit()
    pace_collector()
    table: dict[str, Any] = {}
    rows = []
    for workers in QUICK_SIZES if quick else SIZES:
        runs = [trial(workers) for _ in range(trials)]
        median = summarize(runs)
        table[str(workers)] = {"trials": runs, "median": median}
        rows.append([workers, median["round_s"], median["floor_round_s"],
                     median["round_s"] / median["floor_round_s"], median["join_req_per_s"],
                     median["store_s"], median["store_req_per_s"],
                     median["server_cpu_round_s"], median["floor_server_cpu_round_s"],
                     median["server_cpu_store_s"]])
    print_table(f"rendezvous: N workers join round 1, then set + get a key; median of {trials}"
                f" (floor: a bare aiohttp server holding the same joins)",
                ["N", "round s", "floor s", "x floor", "join req/s", "store s", "store req/s",
                 "srv cpu round s", "floor cpu s", "srv cpu store s"], rows)
    return table
