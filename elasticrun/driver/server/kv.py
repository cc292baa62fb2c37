"""The store endpoints behind the workers' torch.distributed.Store, behind one gate.

The gate: a round's keys belong to its members. A worker the job does not know gets 403;
keys of a round that is over, or that broke, get 410 (whoever waits on them stops now);
keys of a round the worker is not a member of get 403.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from elasticrun import protocol
from elasticrun.driver.rounds.state import JobState
from elasticrun.driver.server import payload as p
from elasticrun.driver.server.kvstore import KVStore
from elasticrun.driver.server.signing import PAYLOAD

READS = frozenset({"get", "wait", "multi_get"})


class KVEndpoints:
    def __init__(self, state: JobState) -> None:
        self._state = state
        self.store = KVStore()

    def _gate(self, worker_id: str, op: str, keys: list[str]) -> web.Response | None:
        state = self._state
        worker = state.workers.get(worker_id)
        if worker is None or not worker.alive:
            return p.error(403, "unknown worker")
        current = state.round
        for number in {n for key in keys if (n := protocol.round_of_key(key)) is not None}:
            if current is not None and number < current.number:
                return p.error(410, f"round {number} is over")
            if current is None or number > current.number \
                    or worker_id not in current.member_ids:
                return p.error(403, f"not a member of round {number}")
        if op in READS and self._broke(keys, missing_only=True):
            return p.error(410, "the round these keys belong to broke")
        return None

    def _broke(self, keys: list[str], missing_only: bool = False) -> bool:
        store = self.store
        return any(store.is_abandoned(key) and not (missing_only and store.get(key) is not None)
                   for key in keys)

    async def handle(self, request: web.Request) -> web.Response:
        op = request.match_info["op"]
        body = request[PAYLOAD]
        if op not in protocol.KV_OPS:
            return p.error(404, f"unknown store operation {op[:40]!r}")
        refused = self._gate(p.string(body, "worker"), op, p.touched_keys(op, body))
        if refused is not None:
            return refused
        store = self.store
        result: dict[str, Any]
        if op == "set":
            store.set(p.key(body), p.blob(body, "value"))
            result = {}
        elif op == "get":
            key = p.key(body)
            if store.get(key) is None:
                await store.wait([key], p.poll_timeout(body))
            value = store.get(key)
            if value is None and self._broke([key]):
                return p.error(410, "the round this key belongs to broke")
            result = {"value": None if value is None else p.b64(value)}
        elif op in ("multi_get", "wait"):
            keys = p.keys(body)
            if op == "multi_get" and "set_key" in body:  # the asker's own key, set first
                store.set(p.key(body, "set_key"), p.blob(body, "set_value"))
            # partial: wait for the first key only, then answer every key that exists
            partial = op == "multi_get" and p.flag(body, "partial")
            found = await store.wait(keys[:1] if partial else keys, p.poll_timeout(body))
            if not found and self._broke(keys):
                return p.error(410, "the round these keys belong to broke")
            if op == "wait":
                result = {"ready": found}
            elif partial:
                result = {"values": [None if (v := store.get(k)) is None else p.b64(v)
                                     for k in keys] if found else None}
            else:
                result = {"values": [p.b64(store.get(k) or b"") for k in keys] if found else None}
        elif op == "add":
            try:
                result = {"value": store.add(p.key(body), p.amount(body))}
            except ValueError as exc:
                raise p.BadRequest(str(exc)) from None
        elif op == "compare_set":
            value = store.compare_set(p.key(body), p.blob(body, "expected"),
                                      p.blob(body, "desired"))
            result = {"value": p.b64(value)}
        elif op == "check":
            result = {"ready": store.check(p.keys(body))}
        elif op == "delete":
            result = {"deleted": store.delete(p.key(body))}
        else:  # num_keys
            result = {"count": store.num_keys()}
        return web.json_response(result)
