"""The floor under benchmarks/rendezvous_scale.py: a bare aiohttp server doing the least a
rendezvous can do, in its own process.

`python aiohttp_floor_server.py N`: one POST route at the join path that reads the body,
holds every request until N have arrived, then answers each with a fixed "run" reply for
its worker (rank = the number in its id); no signing, no round machine, no store. What it
costs per join is aiohttp's and asyncio's own cost per connection and request on this
machine, below which no aiohttp server can go. The same stdin protocol as
rendezvous_server.py (a line in, the CPU seconds since the last one out).
"""

from __future__ import annotations

import asyncio
import json
import sys

from aiohttp import web
from kit import report_cpu_per_line

from elasticrun import protocol
from elasticrun.driver.server.app import LISTEN_BACKLOG
from elasticrun.driver.server.gc_policy import pace_for_serving
from elasticrun.system.process_setup import raise_open_file_limit


class Barrier:
    def __init__(self, workers: int) -> None:
        self._workers = workers
        self._held: list[tuple[int, asyncio.Future[None]]] = []
        self._open = asyncio.get_running_loop().create_future()

    async def join(self, request: web.Request) -> web.Response:
        worker = json.loads(await request.read())["worker_id"]
        rank = int(worker[1:])
        if len(self._held) + 1 < self._workers:
            self._held.append((rank, self._open))
            await self._open
        elif not self._open.done():
            self._open.set_result(None)
        return web.Response(body=json.dumps({
            "action": "run", "round": 1, "notice_seq": 0, "reason": "",
            "slot": {"hostname": "h", "rank": rank, "size": self._workers, "local_rank": 0,
                     "local_size": 1, "cross_rank": 0, "cross_size": 1}}).encode(),
            content_type="application/json")


async def serve(workers: int) -> None:
    pace_for_serving()
    app = web.Application()
    app.router.add_post(protocol.PATH_JOIN, Barrier(workers).join)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=LISTEN_BACKLOG)
    await site.start()
    print(runner.addresses[0][1], flush=True)
    await report_cpu_per_line()
    await runner.cleanup()


if __name__ == "__main__":
    raise_open_file_limit()
    asyncio.run(serve(int(sys.argv[1])))
