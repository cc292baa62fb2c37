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
        worker = p.field(body, "worker_id", str)[:200]
        log.debug("timeline request from worker %s", worker)
        if "open" in body:
            path = p.field(body, "open", str)
            if not path or len(path) > MAX_PATH or "\0" in path:
                raise p.BadRequest("field 'open' must be a file path")
            try:
                self.timeline.open(path)
            except TimelineConflict as exc:
                return p.error(409, str(exc))
            except OSError as exc:
                return p.error(400, f"cannot write the timeline {path}: {exc.strerror or exc}")
        events = body.get("events", [])
        if not isinstance(events, list):
            raise p.BadRequest("field 'events' must be a list")
        try:
            written = self.timeline.add(worker, p.optional(body, "rank", int, -1),
                                        p.optional(body, "host", str, "")[:200], events,
                                        p.optional(body, "dropped", int, 0))
        except ValueError as exc:
            raise p.BadRequest(str(exc)) from None
        return web.json_response({"recording": self.timeline.recording, "written": written})
