"""Hang detection's cost to the driver, at N simulated workers (rendezvous_scale.py's lean
clients against the driver's real server and round machine, in its own process).

steady  every worker holds its notice long-poll, as a real worker's watcher does (15 s
        polls, the default --driver-timeout's): the driver's CPU per second over one poll
        period. Hang detection adds nothing here: no message, no field beyond the polls
        that were there before it (probe_ack, an integer).
stall   one worker hangs (its poll stays open, it never answers); the round's designated
        reporters (about 8) report the stall every second, and every other member answers
        each probe at once, with its liveness, as a real watcher does. The driver's CPU in
        the stall's first second (the first probe: an answer from every member) and on
        average over STALL_S seconds (probes back off to max(2 s, 2.5 ms a member)).
The simulated server has no launcher, so nobody inspects the hung worker's process and the
stall lasts: this measures the chatter alone, at its worst.
"""

from __future__ import annotations

import asyncio
from typing import Any

from benchlib import print_table, summarize
from rendezvous_scale import Server, Worker, pace_collector, raise_fd_limit

from elasticrun import protocol

SIZES = [1024, 4096]
QUICK_SIZES = [64]
POLL_S = 15.0  # a watcher's poll at the default --driver-timeout (30 s / 2)
STALL_S = 20.0
REPORTERS = 8
QUICK_SCALE = 0.2  # quick mode: the windows this much shorter


class Member(Worker):
    """A worker's notice watcher: polls, answers probes at once; `hung` never answers."""

    def __init__(self, index: int, workers: int, port: int, secret: str) -> None:
        super().__init__(index, workers, port, secret)
        self.probe = 0
        self.answers = 0

    async def watch(self, hung: bool, stop: asyncio.Event) -> None:
        answered = 0
        while not stop.is_set():
            payload: dict[str, Any] = {"after": 0, "round": 1, "timeout": POLL_S,
                                       "worker_id": self.worker_id, "probe_ack": self.probe}
            if self.probe > answered:
                payload["liveness"] = {"in_collective": True, "since_s": 1.0, "cpu_s": 1.0}
                answered = self.probe
                self.answers += 1
            reply = await self.post(protocol.PATH_NOTICES, payload)
            if hung and int(reply.get("probe", 0)):
                await stop.wait()  # stopped: it never polls again
            self.probe = max(self.probe, int(reply.get("probe", 0)))

    async def report(self, stop: asyncio.Event, reporter: Worker) -> None:
        """A designated reporter's stall reports (its own connection, as the worker's
        reporter thread has)."""
        while not stop.is_set():
            await reporter.post(protocol.PATH_STALLED, {"worker_id": self.worker_id,
                                                        "round": 1, "waited_s": 1.0})
            await asyncio.sleep(1.0)


async def run(workers: int, server: Server, secret: str, scale: float) -> dict[str, float]:
    fleet = [Member(i, workers, server.port, secret) for i in range(workers)]
    reporters = [Worker(i, workers, server.port, secret)
                 for i in range(0, workers, max(1, workers // REPORTERS))]
    try:
        await asyncio.gather(*(member.join() for member in fleet))
        stop = asyncio.Event()
        server.cpu_since_last()
        watchers = [asyncio.ensure_future(m.watch(m.index == workers - 1, stop)) for m in fleet]
        steady_s = (POLL_S + 1.0) * scale
        await asyncio.sleep(steady_s)
        steady_cpu = server.cpu_since_last()
        requests = sum(m.requests for m in fleet)
        reports = [asyncio.ensure_future(fleet[r.index].report(stop, r)) for r in reporters]
        await asyncio.sleep(1.0)
        first_cpu = server.cpu_since_last()
        await asyncio.sleep(STALL_S * scale - 1.0)
        rest_cpu = server.cpu_since_last()
        stall_requests = sum(m.requests for m in fleet) + sum(r.requests for r in reporters) \
            - requests
        probes = max(m.probe for m in fleet)
        stop.set()
        for task in watchers + reports:
            task.cancel()
        await asyncio.gather(*watchers, *reports, return_exceptions=True)
    finally:
        for worker in [*fleet, *reporters]:
            worker.connection.close()
    stall_s = STALL_S * scale
    return {"steady_core": steady_cpu / steady_s, "stall_first_s_core": first_cpu,
            "stall_core": (first_cpu + rest_cpu) / stall_s,
            "stall_req_per_s": stall_requests / stall_s, "probes": probes}


def bench(trials: int, quick: bool) -> dict[str, Any]:
    raise_fd_limit()
    pace_collector()
    table: dict[str, Any] = {}
    rows = []
    for workers in QUICK_SIZES if quick else SIZES:
        runs = []
        for _ in range(trials):
            secret = protocol.new_secret()
            server = Server(workers, secret)
            try:
                runs.append(asyncio.run(run(workers, server, secret,
                                            QUICK_SCALE if quick else 1.0)))
            finally:
                server.close()
        median = summarize(runs)
        table[str(workers)] = {"trials": runs, "median": median}
        rows.append([workers, f"{100 * median['steady_core']:.1f}%",
                     f"{100 * median['stall_first_s_core']:.0f}%",
                     f"{100 * median['stall_core']:.1f}%", median["stall_req_per_s"],
                     median["probes"]])
    window = STALL_S * (QUICK_SCALE if quick else 1.0)
    print_table(f"hang detection's cost to the driver (share of one core; median of {trials}): "
                f"steady (every worker's notice poll held) and a {window:g} s stall of one "
                f"hung worker",
                ["N", "steady", "stall 1st s", f"stall avg {window:g}s", "stall req/s",
                 "probes"], rows)
    return table
