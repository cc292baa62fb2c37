"""The flash commits' endpoint (PATH_FLASH): a worker's cadence report.

    {"worker_id": ..., "every": 1, "copy_s": 0.0004, "step_s": 0.12, "commits": 40,
     "skipped": 0}
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from elasticrun.driver.operate.flash_cadence import CadenceReport, FlashCadences
from elasticrun.driver.server import payload as p
from elasticrun.driver.server.signing import PAYLOAD

MAX_SECONDS = 86400.0


class FlashEndpoint:
    def __init__(self, cadences: FlashCadences, known: Callable[[str], bool]) -> None:
        self.cadences = cadences
        self._known = known

    async def handle(self, request: web.Request) -> web.Response:
        body = request[PAYLOAD]
        worker = p.string(body, "worker_id")
        if not self._known(worker):
            return p.error(403, "unknown worker")
        self.cadences.report(worker, CadenceReport(
            p.integer(body, "every", 1), p.number(body, "copy_s", 0.0, MAX_SECONDS),
            p.number(body, "step_s", 0.0, MAX_SECONDS), p.integer(body, "commits"),
            p.integer(body, "skipped")))
        return web.json_response({})
