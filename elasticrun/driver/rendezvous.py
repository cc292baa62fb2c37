"""The driver's HTTP server (aiohttp): per-round slot assignment, the KV store, notices.

Every request is signed with the job secret (see protocol.py); bodies are JSON objects
of bounded size; a malformed or unauthenticated request gets a 4xx and changes nothing.
The round decisions themselves are the driver's: this module only answers from the
table the driver gives it and tells the driver what workers asked for.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from elasticrun import protocol
from elasticrun.driver.assignment import Assignment, SlotId
from elasticrun.driver.kvstore import KVStore

log = logging.getLogger("elasticrun.rendezvous")

SHUTDOWN_TIMEOUT_S = 2.0
# Every worker of a job connects at once when a round opens: with the usual backlog of 128,
# a large job overflows the accept queue and the dropped connections retry only after 1 s
# or more. The kernel caps this at net.core.somaxconn.
LISTEN_BACKLOG = 4096
PAYLOAD = web.RequestKey("payload", dict)


class RendezvousListener(Protocol):
    """What the driver hears from the server."""

    def barrier_started(self, round_number: int) -> None: ...

    def reset_requested(self, worker_id: str, last_round: int) -> None: ...

    def worker_released(self, worker_id: str) -> None: ...

    def worker_joined(self, worker_id: str, round_number: int, rank: int) -> None: ...

    def standby_ready(self, worker_id: str) -> None: ...

    def round_completed(self, round_number: int) -> None: ...

    def worker_synced(self, worker_id: str, round_number: int) -> None: ...


@dataclass
class Round:
    number: int
    assignment: Assignment
    members: dict[SlotId, str]  # slot -> worker id holding it
    notice_seq: int
    joined: set[str] = field(default_factory=set)
    complete: bool = False
    settled: bool = False  # every member holds the committed state (reported its sync)
    opened_at: float = field(default_factory=time.monotonic)
    # The members' worker ids: membership checks and "has everyone joined" in O(1), not O(N)
    # per request (a round of N joins would be O(N^2)). `joined` only ever holds members.
    member_ids: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self.member_ids = frozenset(self.members.values())

    def missing(self) -> list[SlotId]:
        return [slot for slot, worker in self.members.items() if worker not in self.joined]


class BadRequest(Exception):
    """The request is well signed but its content is not what the endpoint expects."""


class Rendezvous:
    def __init__(self, secret: str, listener: RendezvousListener) -> None:
        self._secret = secret
        self._listener = listener
        self.store = KVStore()
        self._workers: dict[str, SlotId] = {}
        self._standby: set[str] = set()  # started for a round not yet opened
        self._standby_seen: set[str] = set()
        self._round: Round | None = None
        self._notice_seq = 0
        self._broken_round = 0
        self._waiters: set[asyncio.Future[bool]] = set()  # long-polls, until a change
        self._seen_nonces: OrderedDict[str, float] = OrderedDict()
        self._runner: web.AppRunner | None = None
        self._operator_resources: set[web.AbstractResource | None] = set()
        self._closing = False
        self.port = 0
        self.listening: list[str] = []
        # How long a worker without a place waits for the round that replaces it to settle.
        self.hold_leaving_s = 60.0

    # --- driver-facing -------------------------------------------------------------
    @property
    def current_round(self) -> Round | None:
        return self._round

    @property
    def notice_seq(self) -> int:
        return self._notice_seq

    def register_worker(self, worker_id: str, slot: SlotId, standby: bool = False) -> None:
        """`standby`: the worker is for a round not yet opened; it waits instead of being
        told to leave while the current round has no place for it."""
        self._workers[worker_id] = slot
        if standby:
            self._standby.add(worker_id)

    def forget_worker(self, worker_id: str) -> None:
        self._workers.pop(worker_id, None)
        self._standby.discard(worker_id)
        self._standby_seen.discard(worker_id)

    def open_round(self, number: int, assignment: Assignment, members: dict[SlotId, str]) -> Round:
        previous = self._round
        self._round = Round(number, dict(assignment), dict(members), self._notice_seq)
        self._standby.clear()  # standbys are members now, or have no place
        self._standby_seen.clear()
        if previous is not None:
            self.store.delete_prefix(protocol.round_prefix(previous.number - 1))
        self._wake()
        return self._round

    def mark_settled(self, round_number: int) -> None:
        """Every member of `round_number` holds the committed state: workers that have no
        place in it may go now (until then they are kept, as a last copy of the state)."""
        if self._round is not None and self._round.number == round_number:
            self._round.settled = True
            self._wake()

    def mark_broken(self, round_number: int) -> None:
        """Tells the members of `round_number` that it broke: they stop waiting on it."""
        if round_number > self._broken_round:
            self._broken_round = round_number
            self.store.abandon_prefix(protocol.round_prefix(round_number))
            self._wake()

    def post_notice(self) -> int:
        """Tells the rank-0 coordinator that hosts changed; returns the new sequence number."""
        self._notice_seq += 1
        self._wake()
        return self._notice_seq

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            _settle(waiter, True)

    async def _wait_change(self, deadline: float) -> bool:
        """True when something changed before `deadline` (time.monotonic()), else False.
        A future and a timer per wait: asyncio.wait_for costs a task each, which a round of
        thousands of held joins pays thousands of times."""
        if self._closing:
            return False
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        timer = loop.call_later(remaining, _settle, waiter, False)
        self._waiters.add(waiter)
        try:
            return await waiter
        finally:
            timer.cancel()
            self._waiters.discard(waiter)

    # --- server lifecycle ------------------------------------------------------------
    async def start(self, host: str | Sequence[str], port: int = 0,
                    extra_routes: Iterable[web.RouteDef] = ()) -> int:
        """Serves the worker endpoints, and `extra_routes` (which do their own auth), on
        one port of each address in `host`."""
        hosts = [host] if isinstance(host, str) else list(host)
        app = web.Application(
            client_max_size=protocol.MAX_BODY_BYTES, middlewares=[self._authenticate]
        )
        app.router.add_post(protocol.PATH_JOIN, self._handle_join)
        app.router.add_post(protocol.PATH_NOTICES, self._handle_notices)
        app.router.add_post(protocol.PATH_SYNCED, self._handle_synced)
        app.router.add_post(protocol.PATH_KV_PREFIX + "{op}", self._handle_kv)
        added = app.router.add_routes(list(extra_routes))
        self._operator_resources = {route.resource for route in added}  # with their HEADs
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await self._runner.setup()
        site = web.TCPSite(self._runner, hosts[0], port, reuse_address=True,
                           backlog=LISTEN_BACKLOG)
        await site.start()
        addresses = self._runner.addresses
        assert addresses, "the rendezvous server did not bind"
        self.port = int(addresses[0][1])
        self.listening = [hosts[0]]
        for other in hosts[1:]:
            await self.listen(other)
        return self.port

    async def listen(self, host: str) -> None:
        """Also serves on `host` (same port)."""
        assert self._runner is not None
        if host not in self.listening:
            await web.TCPSite(self._runner, host, self.port, reuse_address=True,
                              backlog=LISTEN_BACKLOG).start()
            self.listening.append(host)

    async def stop(self) -> None:
        self._closing = True  # long-polls answer at once instead of holding the shutdown
        self._wake()
        self.store.wake_all()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- HTTP ------------------------------------------------------------------------
    @web.middleware
    async def _authenticate(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.match_info.route.resource in self._operator_resources:
            return await handler(request)  # operator endpoints: their own auth (control.py)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, "request body too large")
        except web.RequestPayloadError:
            return _error(400, "unreadable request body")
        except ConnectionError:  # the worker went away mid-request (it may have died)
            return _error(400, "connection lost")
        headers = {key: request.headers.get(key, "") for key in (
            protocol.HEADER_TIMESTAMP, protocol.HEADER_NONCE, protocol.HEADER_SIGNATURE)}
        now = time.time()
        reason = protocol.verify_signature(
            self._secret, request.method, request.path_qs, body, headers, now)
        if reason is None:
            reason = self._check_nonce(headers[protocol.HEADER_NONCE], now)
        if reason is not None:
            log.debug("refused %s %s from %s: %s", request.method, request.path, request.remote,
                      reason)
            return _error(401, reason)
        try:
            payload = json.loads(body) if body else {}
        except (ValueError, UnicodeDecodeError, RecursionError):
            return _error(400, "body is not JSON")
        if not isinstance(payload, dict):
            return _error(400, "body must be a JSON object")
        request[PAYLOAD] = payload
        try:
            return await handler(request)
        except BadRequest as exc:
            return _error(400, str(exc))

    def _check_nonce(self, nonce: str, now: float) -> str | None:
        while self._seen_nonces:
            oldest, expiry = next(iter(self._seen_nonces.items()))
            if expiry > now:
                break
            del self._seen_nonces[oldest]
        if nonce in self._seen_nonces:
            return "replayed request"
        self._seen_nonces[nonce] = now + 2 * protocol.SIGNATURE_WINDOW_S
        return None

    async def _handle_join(self, request: web.Request) -> web.Response:
        payload = request[PAYLOAD]
        worker_id = _field(payload, "worker_id", str)
        last_round = _field(payload, "last_round", int)
        if worker_id not in self._workers:
            return _error(403, "unknown worker")
        reply = await self._join(worker_id, last_round)
        return web.json_response(reply.to_json())

    async def _join(self, worker_id: str, last_round: int) -> protocol.JoinReply:
        deadline = time.monotonic() + protocol.MAX_POLL_S
        asked_reset = False
        while True:
            current = self._round
            slot = self._workers.get(worker_id)
            if slot is None:
                return protocol.JoinReply("exit", reason="this worker was stopped")
            if current is not None and current.number > last_round:
                if current.members.get(slot) != worker_id:
                    held = time.monotonic() - current.opened_at < self.hold_leaving_s
                    if worker_id not in self._standby and (current.settled or not held):
                        self._listener.worker_released(worker_id)
                        return protocol.JoinReply(
                            "exit", round=current.number, reason="no place in the new round")
                    if worker_id in self._standby and worker_id not in self._standby_seen:
                        self._standby_seen.add(worker_id)  # waits for the next round
                        self._listener.standby_ready(worker_id)
                else:
                    if worker_id not in current.joined:
                        current.joined.add(worker_id)
                        if len(current.joined) == 1:
                            self._listener.barrier_started(current.number)
                        if len(current.joined) == len(current.member_ids):
                            current.complete = True
                            self._wake()
                            self._listener.round_completed(current.number)
                    if current.complete:
                        info = current.assignment[slot]
                        self._listener.worker_joined(worker_id, current.number, info.rank)
                        return protocol.JoinReply("run", round=current.number, slot=info,
                                                  notice_seq=current.notice_seq)
            elif current is not None and not asked_reset:
                asked_reset = True
                self._listener.reset_requested(worker_id, last_round)
            if not await self._wait_change(deadline):
                return protocol.JoinReply("retry")

    async def _handle_synced(self, request: web.Request) -> web.Response:
        payload = request[PAYLOAD]
        worker_id = _field(payload, "worker_id", str)
        round_number = _field(payload, "round", int)
        if worker_id not in self._workers:
            return _error(403, "unknown worker")
        self._listener.worker_synced(worker_id, round_number)
        return web.json_response({})

    async def _handle_notices(self, request: web.Request) -> web.Response:
        """Long-polls until a notice newer than `after` exists or round `round` broke."""
        payload = request[PAYLOAD]
        after = _field(payload, "after", int)
        watched = payload.get("round", 0)
        if isinstance(watched, bool) or not isinstance(watched, int):
            raise BadRequest("field 'round' must be an integer")
        deadline = time.monotonic() + min(
            protocol.MAX_POLL_S, max(0.0, _number(payload, "timeout", 0.0)))
        while self._notice_seq <= after and not (0 < watched <= self._broken_round) \
                and await self._wait_change(deadline):
            pass
        return web.json_response({"seq": self._notice_seq, "broken_round": self._broken_round})

    def _check_member(self, worker_id: str, keys: list[str]) -> web.Response | None:
        """A round's keys are its members' only: a worker of another round (a late one, a
        released one) cannot read or change them."""
        if worker_id not in self._workers:
            return _error(403, "unknown worker")
        current = self._round
        for number in {n for key in keys if (n := protocol.round_of_key(key)) is not None}:
            if current is not None and number < current.number:
                return _error(410, f"round {number} is over")
            if current is None or number > current.number \
                    or worker_id not in current.member_ids:
                return _error(403, f"not a member of round {number}")
        return None

    async def _handle_kv(self, request: web.Request) -> web.Response:
        op = request.match_info["op"]
        payload = request[PAYLOAD]
        store = self.store
        result: dict[str, Any]
        if op not in protocol.KV_OPS:
            return _error(404, f"unknown store operation {op[:40]!r}")
        refused = self._check_member(_field(payload, "worker", str), _touched_keys(op, payload))
        if refused is not None:
            return refused
        if op in ("get", "wait", "multi_get"):
            keys = _keys(payload) if op != "get" else [_key(payload)]
            if any(store.is_abandoned(key) and store.get(key) is None for key in keys):
                return _error(410, "the round these keys belong to broke")
        if op == "set":
            store.set(_key(payload), _value(payload, "value"))
            result = {}
        elif op == "get":
            key = _key(payload)
            if store.get(key) is None:
                await store.wait([key], _timeout(payload))
            value = store.get(key)
            if value is None and store.is_abandoned(key):
                return _error(410, "the round this key belongs to broke")
            result = {"value": None if value is None else _b64(value)}
        elif op == "multi_get":
            keys = _keys(payload)
            found = await store.wait(keys, _timeout(payload))
            if not found and any(store.is_abandoned(key) for key in keys):
                return _error(410, "the round these keys belong to broke")
            values = [store.get(key) or b"" for key in keys]
            result = {"values": [_b64(v) for v in values] if found else None}
        elif op == "add":
            try:
                result = {"value": store.add(_key(payload), _field(payload, "amount", int))}
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
        elif op == "compare_set":
            value = store.compare_set(
                _key(payload), _value(payload, "expected"), _value(payload, "desired"))
            result = {"value": _b64(value)}
        elif op == "check":
            result = {"ready": store.check(_keys(payload))}
        elif op == "wait":
            keys = _keys(payload)
            ready = await store.wait(keys, _timeout(payload))
            if not ready and any(store.is_abandoned(key) for key in keys):
                return _error(410, "the round these keys belong to broke")
            result = {"ready": ready}
        elif op == "delete":
            result = {"deleted": store.delete(_key(payload))}
        elif op == "num_keys":
            result = {"count": store.num_keys()}
        else:
            return _error(404, f"unknown store operation {op[:40]!r}")
        return web.json_response(result)


def _settle(waiter: asyncio.Future[bool], changed: bool) -> None:
    if not waiter.done():
        waiter.set_result(changed)


def _touched_keys(op: str, payload: dict[str, Any]) -> list[str]:
    if op in ("wait", "multi_get", "check"):
        return _keys(payload)
    if op in ("set", "get", "add", "compare_set", "delete"):
        return [_key(payload)]
    return []


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _field(payload: dict[str, Any], name: str, kind: type) -> Any:
    value = payload.get(name)
    if kind is int and isinstance(value, bool):
        raise BadRequest(f"field {name!r} must be an integer")
    if not isinstance(value, kind):
        raise BadRequest(f"field {name!r} must be {'an integer' if kind is int else 'a string'}")
    return value


def _number(payload: dict[str, Any], name: str, default: float) -> float:
    value = payload.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise BadRequest(f"field {name!r} must be a number")
    return float(value)


def _timeout(payload: dict[str, Any]) -> float:
    return min(protocol.MAX_POLL_S, max(0.0, _number(payload, "timeout", 0.0)))


def _key(payload: dict[str, Any]) -> str:
    key = _field(payload, "key", str)
    if len(key) > 1024:
        raise BadRequest("key longer than 1024 characters")
    return key


def _keys(payload: dict[str, Any]) -> list[str]:
    keys = payload.get("keys")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise BadRequest("field 'keys' must be a list of strings")
    return keys


def _value(payload: dict[str, Any], name: str) -> bytes:
    text = _field(payload, name, str)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"field {name!r} must be base64") from None


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()
