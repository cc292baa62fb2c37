"""Requests refused because of who sent them: counted, and logged at most once a minute.

Anyone who can reach the driver's port can send it bad signatures, wrong tokens or broken
HTTP. Each refusal is counted (`elasticrun_refused_requests_total{kind}`), but a line per
request would let an outsider write the driver's log: each kind is logged at most once per
`every_s`, with how many came and from how many addresses since its last line, and never
with a traceback. aiohttp's own traceback for each malformed request goes the same way
(`http_logger()` for one server, `quiet_aiohttp()` for every server of the process).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CollectorRegistry, Counter

from elasticrun.system.printable import printable

log = logging.getLogger("elasticrun.refused")

EVERY_S = 60.0
MAX_ADDRESSES = 64  # distinct addresses remembered per kind between two lines
_REQUEST = ("request", "requests")
_WEBHOOK = ("host-change webhook request", "host-change webhook requests")
_AGENT = ("agent connection", "agent connections")
# kind (the metric's label) -> what was refused (one, many) and why
KINDS: dict[str, tuple[tuple[str, str], str]] = {
    "unsigned": (_REQUEST, "unsigned request"),
    "bad_signature": (_REQUEST, "bad signature"),
    "stale": (_REQUEST, "stale request (are the clocks of the two hosts apart?)"),
    "replayed": (_REQUEST, "replayed request"),
    "body_too_large": (_REQUEST, "body too large"),
    "malformed_http": (_REQUEST, "malformed HTTP"),
    "wrong_webhook_token": (_WEBHOOK, "missing or wrong bearer token"),
    "wrong_agent_token": (_AGENT, "bad signature (is its --token-file the job's agent "
                                  "token?)"),
    "stale_agent": (_AGENT, "stale request (are the clocks of the two hosts apart?)"),
    "replayed_agent": (_AGENT, "replayed request"),
}
_SIGNATURE_KINDS = {"unsigned request": "unsigned", "stale request": "stale",
                    "replayed request": "replayed"}
# aiohttp.server's line for a request it could not parse (web_protocol.handle_error)
_AIOHTTP_ERROR_LINE = "Error handling request from %s"


def signature_kind(reason: str) -> str:
    """The kind of a refusal by protocol.SignatureGuard, from the reason it gave."""
    return _SIGNATURE_KINDS.get(reason, "bad_signature")


def agent_kind(reason: str) -> str:
    """The kind of a refused agent connection (its upgrade request is signed with the
    agent token), from the reason SignatureGuard gave."""
    kind = signature_kind(reason)
    return {"stale": "stale_agent", "replayed": "replayed_agent"}.get(kind, "wrong_agent_token")


def refusal_counter(registry: CollectorRegistry) -> Counter:
    counter = Counter("elasticrun_refused_requests",
                      "Requests refused because of their sender (bad signatures, wrong "
                      "tokens, malformed HTTP), by kind.", ["kind"], registry=registry)
    for kind in KINDS:
        counter.labels(kind)  # every kind is a series from the start, at 0
    return counter


@dataclass
class _Held:
    """Refusals of one kind since its last line."""

    count: int = 0
    since: float = 0.0  # when the last line was written (or the first refusal came)
    addresses: set[str] = field(default_factory=set)
    more_addresses: bool = False  # more than MAX_ADDRESSES of them
    logged: bool = False  # a line of this kind was ever written
    timer: asyncio.TimerHandle | None = None


class Outsiders:
    def __init__(self, counter: Counter | None = None, *,
                 clock: Callable[[], float] = time.monotonic, every_s: float = EVERY_S,
                 logger: logging.Logger = log) -> None:
        """`counter`: the driver's (metrics.py); without one, a counter of its own."""
        self.counter = counter if counter is not None else refusal_counter(CollectorRegistry())
        self._clock = clock
        self._every_s = every_s
        self._log = logger
        self._held: dict[str, _Held] = {}
        self._totals: dict[str, int] = dict.fromkeys(KINDS, 0)

    def refused(self, kind: str, remote: str | None) -> None:
        """Counts one refused request of `kind` (a key of KINDS) from `remote`."""
        if kind not in KINDS:
            raise ValueError(f"unknown kind of refusal {kind!r}")
        self.counter.labels(kind).inc()
        self._totals[kind] += 1
        now = self._clock()
        held = self._held.setdefault(kind, _Held(since=now))
        held.count += 1
        address = printable((remote or "?")[:64])
        if len(held.addresses) < MAX_ADDRESSES:
            held.addresses.add(address)
        elif address not in held.addresses:
            held.more_addresses = True
        if not held.logged or now - held.since >= self._every_s:
            self._write(kind, held, now)
        elif held.timer is None:
            held.timer = _call_later(held.since + self._every_s - now, self._due, kind)

    def count(self, kind: str) -> int:
        """How many refusals of `kind` this object counted."""
        return self._totals[kind]

    def flush(self) -> None:
        """Writes the line of every kind with refusals held back (at the driver's end)."""
        now = self._clock()
        for kind, held in self._held.items():
            if held.count:
                self._write(kind, held, now)

    def _due(self, kind: str) -> None:
        held = self._held[kind]
        held.timer = None
        if held.count:
            self._write(kind, held, self._clock())

    def _write(self, kind: str, held: _Held, now: float) -> None:
        if held.timer is not None:
            held.timer.cancel()
            held.timer = None
        (one, many), why = KINDS[kind]
        if not held.logged:
            article = "an" if one[0] in "aeiou" else "a"
            self._log.warning("refused %s %s from %s: %s; more are counted in "
                              "elasticrun_refused_requests_total{kind=\"%s\"} and logged "
                              "at most every %gs", article, one, _from(held), why, kind,
                              self._every_s)
        else:
            self._log.warning("refused %d %s from %s in the last %.0fs: %s", held.count,
                              one if held.count == 1 else many, _from(held),
                              max(1.0, now - held.since), why)
        held.logged = True
        held.count = 0
        held.since = now
        held.addresses.clear()
        held.more_addresses = False

    # --- aiohttp's own lines --------------------------------------------------------------
    def http_logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger for one aiohttp server (`web.AppRunner(app, logger=...)`): its line and
        traceback for each malformed request become a refusal of kind "malformed_http";
        everything else goes to aiohttp.server as before."""
        return _HttpLogger(self)

    def take_aiohttp_record(self, record: logging.LogRecord) -> bool:
        """Whether `record` is aiohttp's line for a malformed request: counted if so."""
        exc = record.exc_info[1] if record.exc_info else None
        if record.msg != _AIOHTTP_ERROR_LINE or not _malformed(exc):
            return False
        args = record.args if isinstance(record.args, tuple) else ()
        self.refused("malformed_http", str(args[0]) if args else None)
        return True


class _HttpLogger(logging.LoggerAdapter[logging.Logger]):
    def __init__(self, outsiders: Outsiders) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self._outsiders = outsiders

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if msg == _AIOHTTP_ERROR_LINE and _malformed(exc):
            self._outsiders.refused("malformed_http", str(args[0]) if args else None)
            return
        super().log(level, msg, *args, **kwargs)


class _AiohttpFilter(logging.Filter):
    def __init__(self, outsiders: Outsiders) -> None:
        super().__init__()
        self._outsiders = outsiders

    def filter(self, record: logging.LogRecord) -> bool:
        return not self._outsiders.take_aiohttp_record(record)


@contextlib.contextmanager
def quiet_aiohttp(outsiders: Outsiders) -> Iterator[None]:
    """While open, aiohttp's line and traceback for each malformed request, from any server
    of this process, become a refusal of kind "malformed_http" of `outsiders`."""
    logger = logging.getLogger("aiohttp.server")
    quiet = _AiohttpFilter(outsiders)
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _malformed(exc: object) -> bool:
    """A request aiohttp could not parse (a 4xx of its own, not a handler's exception)."""
    return isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 400) < 500


def _from(held: _Held) -> str:
    first = sorted(held.addresses)[0] if held.addresses else "?"
    others = len(held.addresses) - 1
    if held.more_addresses:
        return f"{first} and more than {others} other addresses"
    if others > 0:
        return f"{first} and {others} other address{'' if others == 1 else 'es'}"
    return first


def _call_later(delay: float, callback: Callable[[str], None], kind: str
                ) -> asyncio.TimerHandle | None:
    """On the running loop, if there is one (the held line is written when it is due)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return loop.call_later(max(0.0, delay), callback, kind)
