"""The endpoints of a job launched from Python (`elasticrun.run`): the function out, results in.

Every worker fetches the cloudpickled `(func, args, kwargs)`; each sends back its pickled
result in parts (a request body is bounded by protocol.MAX_BODY_BYTES), tagged with the
round and rank it finished in. The server only keeps what arrives: which results count is
decided when the job is over, from the machine's last round (api/func_job.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from elasticrun.driver.rounds.state import JobState
from elasticrun.driver.server import payload as p
from elasticrun.driver.server.signing import PAYLOAD

MAX_PARTS = 1 << 20  # 2 TiB of result: a count beyond this is a malformed request


@dataclass(frozen=True)
class ReceivedResult:
    round: int
    rank: int
    data: bytes


@dataclass
class _Parts:
    round: int
    rank: int
    count: int
    chunks: list[bytes] = field(default_factory=list)


class ResultEndpoints:
    def __init__(self, state: JobState) -> None:
        self._state = state
        self.payload: bytes | None = None  # None: the job runs a command, not a function
        self.received: dict[str, ReceivedResult] = {}  # worker id -> its whole result
        self._partial: dict[str, _Parts] = {}

    def _refusal(self, worker_id: str) -> web.Response | None:
        worker = self._state.workers.get(worker_id)
        if worker is None or not worker.alive:
            return p.error(403, "unknown worker")
        if self.payload is None:
            return p.error(404, "this job runs a command, not a function")
        return None

    async def function(self, request: web.Request) -> web.Response:
        body = request[PAYLOAD]
        refusal = self._refusal(p.string(body, "worker_id"))
        if refusal is not None:
            return refusal
        assert self.payload is not None
        return web.json_response({"payload": p.b64(self.payload)})

    async def result(self, request: web.Request) -> web.Response:
        """One part of a worker's result. A part sent again (its answer was lost and the
        client retried) is taken once; part 0 starts the result over."""
        body = request[PAYLOAD]
        worker_id = p.string(body, "worker_id")
        refusal = self._refusal(worker_id)
        if refusal is not None:
            return refusal
        round_number, rank = p.integer(body, "round"), p.integer(body, "rank")
        part, count = p.integer(body, "part"), p.integer(body, "parts")
        data = p.blob(body, "data")
        if not 0 < count <= MAX_PARTS or not 0 <= part < count:
            raise p.BadRequest(f"part {part} of {count} is out of range")
        parts = self._partial.get(worker_id)
        if part == 0:
            parts = self._partial[worker_id] = _Parts(round_number, rank, count)
            self.received.pop(worker_id, None)
        elif parts is None:
            if worker_id in self.received:  # the last part again: taken already
                return web.json_response({})
            raise p.BadRequest(f"part {part} of {count} came before part 0")
        if (round_number, rank, count) != (parts.round, parts.rank, parts.count):
            raise p.BadRequest("the parts of one result disagree on round, rank or count")
        if part > len(parts.chunks):
            raise p.BadRequest(f"part {part} of {count} came before part {len(parts.chunks)}")
        if part == len(parts.chunks):
            parts.chunks.append(data)
        if len(parts.chunks) == count:
            del self._partial[worker_id]
            self.received[worker_id] = ReceivedResult(round_number, rank,
                                                      b"".join(parts.chunks))
        return web.json_response({})
