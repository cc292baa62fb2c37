"""The timeline endpoint (PATH_TIMELINE): a worker's trace events, and its start_timeline.

    {"worker_id": ..., "rank": 0, "host": "node1", "events": [[...], ...], "dropped": 0}
    {"worker_id": ..., "open": "/abs/path.json", "events": []}   start_timeline(path)

Answers {"recording": bool, "written": n}; 409 when another timeline is being written.
"""

from __future__ import annotations

import logging

from aiohttp import web

from elasticrun.driver.operate.timeline import JobTimeline, TimelineConflict
from elasticrun.driver.server import payload as p
from elasticrun.driver.server.signing import PAYLOAD

log = logging.getLogger("elasticrun.timeline")

MAX_PATH = 4096


class TimelineEndpoint:
    def __init__(self, timeline: JobTimeline) -> None:
        self.timeline = timeline

    async def handle(self, request: web.Request) -> web.Response:
        body = request[PAYLOAD]
        worker = p.string(body, "worker_id")[:200]
        log.debug("timeline request from worker %s", worker)
        events = p.trace_events(body)
        rank = p.integer(body, "rank", -1, p.MAX_COUNT, default=-1)
        host = p.string(body, "host", default="")[:200]
        dropped = p.integer(body, "dropped", default=0)
        if "open" in body:
            path = p.string(body, "open", MAX_PATH)
            if not path or "\0" in path:
                raise p.BadRequest("field 'open' must be a file path")
            try:
                self.timeline.open(path)
            except TimelineConflict as exc:
                return p.error(409, str(exc))
            except OSError as exc:
                return p.error(400, f"cannot write the timeline {path}: {exc.strerror or exc}")
        try:
            written = self.timeline.add(worker, rank, host, events, dropped)
        except ValueError as exc:
            raise p.BadRequest(str(exc)) from None
        return web.json_response({"recording": self.timeline.recording, "written": written})
