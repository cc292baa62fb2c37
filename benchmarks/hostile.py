"""What outsiders can make a running driver spend: its memory (RSS) and CPU while idle,
under a burst of unauthenticated large requests, and while 1,000 connections are held open
with half a request header each (loopback only).

idle      a real job (one worker that sleeps): the driver's RSS and CPU over WINDOW_S
burst     BURST_CLIENTS clients each POST BURST_BYTES unsigned to a worker route, again and
          again for WINDOW_S: the driver's peak RSS over idle, its CPU, the answers' codes
stalled   STALLED connections each send half a request header and wait: the driver's RSS
          and CPU, how many it still holds after WINDOW_S, and whether a signed worker
          request (GET /status, an operator route) is still answered meanwhile
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from benchlib import Jobs, bench_env, cpu_s, elasticrun_command, print_table, summarize

from elasticrun import protocol

WINDOW_S = 10.0
QUICK_WINDOW_S = 3.0
BURST_CLIENTS = 40
BURST_BYTES = 4 * 1024 * 1024
STALLED = 1000
QUICK_STALLED = 100
STATUS_LINE = re.compile(r"status at (http://[\d.]+:\d+)/status")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Sampler:
    """The driver's RSS every 50 ms and its CPU over the window."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0

    async def over(self, seconds: float, work: asyncio.Future[Any] | None = None
                   ) -> dict[str, float]:
        cpu, started = cpu_s(self.pid), time.monotonic()
        self.peak = _rss_mib(self.pid)
        while time.monotonic() - started < seconds:
            self.peak = max(self.peak, _rss_mib(self.pid))
            await asyncio.sleep(0.05)
        spent = time.monotonic() - started
        return {"rss_mib": _rss_mib(self.pid), "peak_rss_mib": self.peak,
                "cpu_share": (cpu_s(self.pid) - cpu) / spent, "fds": _open_fds(self.pid)}


async def _burst(url: str, stop: asyncio.Event) -> dict[str, int]:
    codes: dict[str, int] = {}
    body = b"x" * BURST_BYTES

    async def client(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            try:
                async with session.post(url + protocol.PATH_JOIN, data=body,
                                        timeout=aiohttp.ClientTimeout(total=10)) as answer:
                    key = str(answer.status)
            except (TimeoutError, aiohttp.ClientError) as exc:
                key = type(exc).__name__
            codes[key] = codes.get(key, 0) + 1

    connector = aiohttp.TCPConnector(limit=BURST_CLIENTS, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(BURST_CLIENTS)))
    return codes


async def _stall(host: str, port: int, count: int, stop: asyncio.Event) -> dict[str, int]:
    streams = []
    for _ in range(count):
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            break
        writer.write(b"POST " + protocol.PATH_JOIN.encode() + b" HTTP/1.1\r\nHost: x\r\n")
        streams.append((reader, writer))
    await stop.wait()
    closed_by_driver = sum(1 for reader, _ in streams if reader.at_eof())
    for _, writer in streams:
        writer.close()
    return {"opened": len(streams), "open_at_end": len(streams) - closed_by_driver}


async def _status_answers(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as session, session.get(
                url + "/status", timeout=aiohttp.ClientTimeout(total=5)) as answer:
            return answer.status == 200
    except (TimeoutError, aiohttp.ClientError):
        return False


async def _measure(pid: int, url: str, window: float, stalled: int) -> dict[str, Any]:
    sampler = Sampler(pid)
    idle = await sampler.over(window)
    stop = asyncio.Event()
    burst = asyncio.ensure_future(_burst(url, stop))
    under_burst = await sampler.over(window)
    stop.set()
    codes = await burst
    stop = asyncio.Event()
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stall = asyncio.ensure_future(_stall(host, int(port), stalled, stop))
    await asyncio.sleep(1.0)
    under_stall = await sampler.over(window)
    answered = await _status_answers(url)
    stop.set()
    held = await stall
    return {"idle": idle, "burst": {**under_burst, "codes": codes},
            "stalled": {**under_stall, **held, "status_answered": answered}}


def _trial(window: float, stalled: int) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, stalled + 256)), hard))
    with Jobs() as jobs:
        proc = jobs.start(elasticrun_command(["-np", "1"], "-c")
                          + ["import time; time.sleep(600)"], bench_env())
        log = jobs.logs[-1]
        deadline = time.monotonic() + 60
        url = None
        while url is None:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the job did not start")
            log.seek(0)
            match = STATUS_LINE.search(log.read())
            url = match.group(1) if match else None
            time.sleep(0.1)
        time.sleep(1.0)  # the worker has started
        return asyncio.run(_measure(proc.pid, url, window, stalled))


def bench(trials: int, quick: bool) -> dict[str, Any]:
    window = QUICK_WINDOW_S if quick else WINDOW_S
    stalled = QUICK_STALLED if quick else STALLED
    results = [_trial(window, stalled) for _ in range(trials)]
    rows = []
    idle_rss = summarize([r["idle"] for r in results])["rss_mib"]
    for phase in ("idle", "burst", "stalled"):
        med = summarize([{k: v for k, v in r[phase].items() if isinstance(v, (int, float))
                          and not isinstance(v, bool)} for r in results])
        rows.append([phase, f"{med['rss_mib']:.0f}", f"{med['peak_rss_mib']:.0f}",
                     f"{med['peak_rss_mib'] - idle_rss:+.0f}",
                     f"{100 * med['cpu_share']:.1f}%", f"{med['fds']:.0f}"])
    print_table(f"hostile: the driver under outsiders ({window:g} s a phase, "
                f"{BURST_CLIENTS} x {BURST_BYTES // 2**20} MiB unsigned POSTs, {stalled} "
                f"half-header connections)",
                ["phase", "RSS MiB", "peak MiB", "peak - idle", "CPU", "fds"], rows)
    last = results[-1]
    print(f"burst answers: {last['burst']['codes']}; stalled: {last['stalled']['opened']} "
          f"opened, {last['stalled']['open_at_end']} still open after {window:g} s; /status "
          f"answered meanwhile: {last['stalled']['status_answered']}")
    return {"trials": results, "window_s": window, "stalled": stalled,
            "burst_clients": BURST_CLIENTS, "burst_bytes": BURST_BYTES,
            "python": sys.version.split()[0]}

