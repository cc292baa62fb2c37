"""Re-adoption at scale: a real driver (`python -m elasticrun --launcher agent --state-dir`)
whose N workers run under simulated agents, SIGKILLed once round 1 is complete, and a
driver resumed AWAY_S later (--resume) taking them back.

The agents (HOSTS = N/8, 8 slots each) speak the real agent protocol (launch/agents/wire.py)
over aiohttp WebSockets, signed with the agent token, as `elasticrun agent` does: hello,
"started" for each worker the driver starts (its sealed environment opened with the token),
"inspected" (running) when asked; on losing the driver they reconnect on the real agent's
backoff (0.1, 0.2, 0.5, 1 s) and name the workers they run in their hello. The workers are
rendezvous_clients.py's lean clients (real signed requests, no torch): each joins round 1,
reports its sync and then long-polls the driver's notices as a real worker's watcher does,
retrying on the real client's backoff (0.05 s doubling to 1 s) while there is no driver, so
the resumed driver meets the reconnecting agents and the polls of every worker at once.
Agents and workers share this machine's cores with the driver, in this process.
Measured: the resumed driver serving (its job_started event, just after it listens) ->
its driver_resumed event (all N re-adopted); its own figure; and its command -> that event.
At the end the agents report every worker exited 0, and the driver's exit status is kept.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from benchlib import (
    PYTHON,
    bench_env,
    cpu_s,
    free_port,
    print_table,
    read_events,
    summarize,
)
from rendezvous_clients import SLOTS_PER_HOST, Connection, pace_collector, raise_fd_limit

from elasticrun import protocol
from elasticrun.launch.agents import wire

SIZES, QUICK_SIZES = [256, 1024], [64]
AWAY_S, QUICK_AWAY_S = 2.0, 0.5
TOKEN = "driver-restart-benchmark-token-0123456789"
AGENT_RETRY_S = (0.1, 0.2, 0.5, 1.0)  # agent/runner.py's RETRY_S
POLL_S = 15.0  # a watcher's poll at the default --driver-timeout
TIMEOUT_S = 180.0


class SimWorker:
    """A lean worker: joins round 1, reports its sync, then watches the notices."""

    def __init__(self, index: int, env: dict[str, str]) -> None:
        self.id, self.secret = env[protocol.ENV_WORKER_ID], env[protocol.ENV_SECRET]
        host = index // SLOTS_PER_HOST
        self.connection = Connection(int(env[protocol.ENV_RENDEZVOUS_PORT]),
                                     f"127.1.{host // 250}.{host % 250 + 1}")
        self.synced = asyncio.Event()

    async def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps(payload).encode()
        status, data = await self.connection.post(
            path, body, protocol.sign_headers(self.secret, "POST", path, body))
        if status != 200:
            raise RuntimeError(f"{self.id} {path}: HTTP {status} {data[:200]!r}")
        reply: dict[str, Any] = json.loads(data)
        return reply

    async def run(self) -> None:
        while (action := (await self.post(protocol.PATH_JOIN, {
                "worker_id": self.id, "last_round": 0}))["action"]) != "run":
            if action != "retry":
                raise RuntimeError(f"{self.id}: told to {action}")
        await self.post(protocol.PATH_SYNCED, {"worker_id": self.id, "round": 1})
        self.synced.set()
        latest, delay = 0, 0.05
        while True:
            try:
                reply = await self.post(protocol.PATH_NOTICES, {
                    "after": latest, "round": 1, "timeout": POLL_S, "worker_id": self.id,
                    "probe_ack": 0})
            except ConnectionError:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            latest, delay = max(latest, int(reply["seq"])), 0.05


class SimAgent:
    def __init__(self, index: int, url: str) -> None:
        self.index, self.url = index, url
        self.host, self.agent_id = f"sim{index:04d}", os.urandom(8).hex()
        self.workers: dict[str, SimWorker] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.hello_at = 0.0  # when its latest hello went out (time.time())

    async def run(self, session: aiohttp.ClientSession) -> None:
        attempt = 0
        while True:
            try:
                headers = protocol.sign_headers(TOKEN, "GET", wire.PATH, b"")
                ws = await session.ws_connect(self.url + wire.PATH, headers=headers,
                                              max_msg_size=wire.MAX_MESSAGE_BYTES)
            except (aiohttp.ClientError, OSError):
                await asyncio.sleep(AGENT_RETRY_S[min(attempt, len(AGENT_RETRY_S) - 1)])
                attempt += 1
                continue
            attempt = 0
            async with ws:
                self.ws, self.hello_at = ws, time.time()
                await ws.send_str(wire.encode(wire.Hello(
                    self.host, SLOTS_PER_HOST, self.agent_id, tuple(self.workers))))
                async for message in ws:
                    if message.type != aiohttp.WSMsgType.TEXT:
                        break
                    await self._handle(ws, wire.decode(message.data))

    async def _handle(self, ws: aiohttp.ClientWebSocketResponse, message: wire.Message) -> None:
        if isinstance(message, wire.Welcome):
            if message.stop:  # re-adoption failed: the trial's count says so
                raise RuntimeError(f"{self.host}: the driver disowned {message.stop}")
        elif isinstance(message, wire.Start):
            env = wire.unseal(TOKEN, message.worker, message.env)
            worker = SimWorker(self.index * SLOTS_PER_HOST + len(self.workers), env)
            self.workers[message.worker] = worker
            self.tasks.append(asyncio.ensure_future(worker.run()))
            await ws.send_str(wire.encode(wire.Started(message.worker, 100_000 + self.index)))
        elif isinstance(message, wire.Inspect):
            await ws.send_str(wire.encode(wire.Inspected(message.worker, "running")))
        elif isinstance(message, wire.Stop | wire.End):
            pass  # the job's end: run() is cancelled by the benchmark

    async def exit_all(self) -> None:
        for task in self.tasks:
            task.cancel()
        assert self.ws is not None
        for worker_id, worker in self.workers.items():
            worker.connection.close()
            await self.ws.send_str(wire.encode(wire.Exited(worker_id, 0)))


async def _until(what: str, check: Callable[[], bool], driver: subprocess.Popen[bytes],
                 timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline or driver.poll() is not None:
            raise RuntimeError(f"driver_restart scale: no {what} (driver exit "
                               f"{driver.poll()}, {timeout:g}s)")
        await asyncio.sleep(0.01)


def _round_complete(state: Path) -> bool:
    try:
        kept = json.loads((state / "journal.json").read_text())["body"]["state"]["round"]
        return bool(kept and kept["complete"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


async def trial(workers: int, away_s: float, tmp: Path) -> dict[str, float]:
    port, log, state = free_port(), tmp / "events.jsonl", tmp / "state"
    (tmp / "token").write_text(TOKEN + "\n")
    command = [PYTHON, "-m", "elasticrun", "--launcher", "agent", "--port", str(port),
               "--bind", "127.0.0.1", "--agent-token-file", str(tmp / "token"),
               "-np", str(workers), "--min-np", str(workers), "--state-dir", str(state),
               "--event-log", str(log), "--start-timeout", "120", PYTHON, "-c", "pass"]

    def start(*extra: str) -> subprocess.Popen[bytes]:
        with open(tmp / "driver.log", "ab") as out:
            return subprocess.Popen(command[:3] + list(extra) + command[3:], env=bench_env(),
                                    stdout=out, stderr=out, stdin=subprocess.DEVNULL)

    def events(kind: str) -> list[dict[str, Any]]:
        return [e for e in read_events(log) if e["type"] == kind]

    agents = [SimAgent(i, f"http://127.0.0.1:{port}") for i in range(workers // SLOTS_PER_HOST)]
    first = start()
    second: subprocess.Popen[bytes] | None = None
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        lives = [asyncio.ensure_future(agent.run(session)) for agent in agents]
        try:
            fleet = lambda: [w for a in agents for w in a.workers.values()]  # noqa: E731
            await _until("round 1", lambda: len(fleet()) == workers and all(
                w.synced.is_set() for w in fleet()) and _round_complete(state), first)
            first.send_signal(signal.SIGKILL)
            first.wait()
            await asyncio.sleep(away_s)
            relaunched = time.time()
            second = start("--resume")
            # The driver's CPU from its serving to its re-adoption, sampled as each is seen.
            await _until("serving", lambda: len(events("job_started")) == 2, second)
            cpu = cpu_s(second.pid)
            await _until("driver_resumed event", lambda: bool(events("driver_resumed")), second)
            cpu = cpu_s(second.pid) - cpu
            await asyncio.sleep(1.0)  # nothing fails after it
            await asyncio.gather(*(agent.exit_all() for agent in agents))
            code = await asyncio.get_running_loop().run_in_executor(None, second.wait, 60)
        finally:
            for life in lives:
                life.cancel()
            for agent in agents:
                for task in agent.tasks:
                    task.cancel()
                for worker in agent.workers.values():
                    worker.connection.close()
            for proc in (first, second):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
    back = events("driver_resumed")[0]
    serving = max(e["time"] for e in events("job_started"))
    if back["data"]["readopted"] != workers or code != 0:
        raise RuntimeError(f"driver_restart scale: {back['data']}, exit {code}: "
                           f"{(tmp / 'driver.log').read_text()[-2000:]}")
    last_hello = max(agent.hello_at for agent in agents)
    return {"serving_to_readopted_s": back["time"] - serving,
            "last_hello_to_readopted_s": back["time"] - last_hello,
            "driver_says_s": back["data"]["seconds"],
            "relaunch_to_readopted_s": back["time"] - relaunched, "driver_cpu_s": cpu,
            "readopted": back["data"]["readopted"], "exit": code}


def scale_bench(trials: int, quick: bool) -> dict[str, Any]:
    raise_fd_limit()
    pace_collector()
    away_s = QUICK_AWAY_S if quick else AWAY_S
    table: dict[str, Any] = {}
    rows = []
    for workers in QUICK_SIZES if quick else SIZES:
        runs = []
        for _ in range(trials):
            with tempfile.TemporaryDirectory() as tmp:
                runs.append(asyncio.run(trial(workers, away_s, Path(tmp))))
        median = summarize(runs)
        table[str(workers)] = {"trials": runs, "median": median}
        rows.append([workers, workers // SLOTS_PER_HOST, median["serving_to_readopted_s"],
                     max(r["serving_to_readopted_s"] for r in runs), median["driver_says_s"],
                     median["last_hello_to_readopted_s"], median["driver_cpu_s"],
                     median["relaunch_to_readopted_s"], f"{median['readopted']:.0f}",
                     f"{median['exit']:.0f}"])
    print_table(f"  re-adoption at scale: simulated agents (8 slots each) and lean workers, "
                f"the real driver SIGKILLed and resumed {away_s:g} s later; median of {trials}",
                ["workers", "agents", "serving->re-adopted s", "max s", "driver says s",
                 "last hello->re-adopted s", "driver CPU s",
                 "relaunch->re-adopted s", "re-adopted", "exit"], rows)
    return table
