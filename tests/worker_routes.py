"""The worker routes as tests use them: a valid request of each, and a fresh job behind a
real `WorkerServer` on 127.0.0.1 (tests/rounds_server.py) that every route can act on."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from elasticrun import protocol
from elasticrun.driver.operate.timeline import JobTimeline
from elasticrun.driver.rounds.assignment import SlotId, assign
from tests.rounds_server import RoundsServer

SECRET = protocol.new_secret()  # the job's
KV = protocol.PATH_KV_PREFIX
MEMBERS = {SlotId("a", 0): "w0", SlotId("a", 1): "w1"}  # round 1, complete
TESTER = "tester"  # a registered worker, member of no round: may use keys outside rounds
ONE = "MQ=="  # base64 of b"1"

# A valid request of every worker route; the property replaces parts of it.
VALID: dict[str, dict[str, Any]] = {
    protocol.PATH_JOIN: {"worker_id": "w0", "last_round": 0, "failure": "",
                         "committed": False},
    protocol.PATH_NOTICES: {"after": 0, "round": 1, "timeout": 0, "worker_id": "w1",
                            "probe_ack": 1, "liveness": {"in_collective": True,
                                                         "since_s": 1.5, "cpu_s": 2.0}},
    protocol.PATH_SYNCED: {"worker_id": "w0", "round": 1},
    protocol.PATH_TRAINED: {"worker_id": "w0"},
    protocol.PATH_FAILING: {"worker_id": "w0", "failure": "boom"},
    protocol.PATH_STALLED: {"worker_id": "w0", "round": 1, "waited_s": 3.0},
    protocol.PATH_INIT: {"worker_id": "w0"},
    protocol.PATH_PACE: {"worker_id": "w0", "round": 1, "busy": 0.9, "interval_s": 1.0},
    protocol.PATH_FLASH: {"worker_id": "w0", "every": 2, "copy_s": 0.004, "step_s": 0.1,
                          "commits": 40, "skipped": 1},
    protocol.PATH_TIMELINE: {"worker_id": "w0", "rank": 0, "host": "a", "dropped": 1,
                             "events": [["X", "step", "train", 1.7e15, 25.0, 0, {"n": 1}],
                                        ["i", "mark", "train", 1.7e15, 0, 1, {}]]},
    protocol.PATH_RUN_FUNCTION: {"worker_id": "w0"},
    protocol.PATH_RUN_RESULT: {"worker_id": "w0", "round": 1, "rank": 0, "part": 0,
                               "parts": 1, "data": ONE},
    KV + "set": {"worker": TESTER, "key": "k", "value": ONE},
    KV + "get": {"worker": TESTER, "key": "k", "timeout": 0},
    KV + "add": {"worker": TESTER, "key": "counter", "amount": 2},
    KV + "compare_set": {"worker": TESTER, "key": "k", "expected": "", "desired": ONE},
    KV + "check": {"worker": TESTER, "keys": ["k", "counter"]},
    KV + "delete": {"worker": TESTER, "key": "k"},
    KV + "num_keys": {"worker": TESTER},
    KV + "wait": {"worker": TESTER, "keys": ["k"], "timeout": 0},
    KV + "multi_get": {"worker": "w0", "keys": ["elasticrun/round1/0", "k"], "timeout": 0,
                       "partial": True, "set_key": "elasticrun/round1/1", "set_value": ONE},
}


def worker_routes() -> set[str]:
    """Every route the worker server serves: protocol's PATH_* and the store's operations."""
    paths = {value for name, value in vars(protocol).items()
             if name.startswith("PATH_") and name != "PATH_KV_PREFIX"}
    return paths | {KV + op for op in protocol.KV_OPS}


@contextlib.asynccontextmanager
async def job(trace: Path | None) -> AsyncIterator[RoundsServer]:
    """A fresh job: round 1 of w0 and w1 complete, a timeline written to `trace` (None: no
    timeline yet), a function job's payload set."""
    rv = RoundsServer(SECRET)
    rv.add_worker(TESTER, SlotId("tester-host", 0))
    for slot, worker in MEMBERS.items():
        rv.add_worker(worker, slot)
    rv.open_round(1, assign([("a", 2)]), MEMBERS)
    rv.current.joined.update(MEMBERS.values())
    rv.current.complete = True
    timeline = JobTimeline(trace, host="driver-host")  # started: None opens nothing
    timeline.start()
    rv.server.timeline.timeline = timeline
    rv.server.results.payload = b"function"
    await rv.start()
    try:
        yield rv
    finally:
        await rv.stop()
        timeline.close()


def snapshot(rv: RoundsServer) -> Any:
    """What a request could change in the job."""
    results = rv.server.results
    return (dict(rv.store._data), list(rv.events), rv.server.timeline.timeline.requests,
            dict(results.received), {w: len(p.chunks) for w, p in results._partial.items()})


async def post(session: aiohttp.ClientSession, port: int, path: str, body: bytes,
               headers: dict[str, str]) -> tuple[int, str]:
    url = URL(f"http://127.0.0.1:{port}{path}", encoded=True)
    async with session.post(url, data=body, headers=headers,
                            timeout=aiohttp.ClientTimeout(total=10)) as response:
        return response.status, await response.text()


def forged(how: str, path: str, body: bytes) -> dict[str, str]:
    if how == "unsigned":
        return {}
    if how == "other secret":
        return protocol.sign_headers(protocol.new_secret(), "POST", path, body)
    return protocol.sign_headers(SECRET, "POST", path, body + b" ")


async def still_serves(session: aiohttp.ClientSession, rv: RoundsServer) -> None:
    body = json.dumps({"worker": TESTER}).encode()
    headers = protocol.sign_headers(SECRET, "POST", KV + "num_keys", body)
    status, text = await post(session, rv.port, KV + "num_keys", body, headers)
    assert status == 200, text
    assert json.loads(text) == {"count": rv.store.num_keys()}
