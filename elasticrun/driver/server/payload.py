"""Checking what a worker sent: every field of every endpoint is validated here, once.

Each accessor takes one field of a request's JSON object, checks its type and bounds (a
number finite and in range, a string or a list no longer than its limit) and raises
BadRequest otherwise, which the signing middleware answers with a 400. So nothing a request
carries can raise anything else further on: a 400-digit integer reaching float() or
math.isfinite() raises OverflowError, a 500.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

from aiohttp import web

from elasticrun import protocol

# Rounds, sequence numbers, ranks, counts: exact in a double (JSON's numbers) and far beyond
# any job's.
MAX_COUNT = 2**53
MAX_ID = 1024  # worker ids, host names, store keys (characters)
MAX_TEXT = 500  # failure messages: a longer one is cut, not refused
MAX_KEYS = 1 << 17  # store keys in one request (a mesh fetch names every rank's)
MAX_AMOUNT = 2**63 - 1  # a store counter's step: torch's counters are int64
MAX_SECONDS = 1e10  # durations a worker reports (waited, since, CPU seconds): centuries
MAX_TIMEOUT_S = 86_400.0  # a long-poll's timeout; answered within MAX_POLL_S anyway
MAX_EVENTS = 100_000  # timeline events in one request (a worker sends at most 4000)
MAX_TIME_US = float(2**53)  # a trace event's time or duration (µs since the epoch)
MAX_DEPTH = 32  # nesting of free-form JSON kept by the driver (a trace event's args)


class BadRequest(Exception):
    """The request is well signed but its content is not what the endpoint expects."""


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _present(payload: dict[str, Any], name: str, default: object) -> bool:
    """Whether `name` is to be checked: it is there, or it is required (no default)."""
    if name in payload:
        return True
    if default is None:
        raise BadRequest(f"field {name!r} is missing")
    return False


def integer(payload: dict[str, Any], name: str, low: int = 0, high: int = MAX_COUNT,
            default: int | None = None) -> int:
    """An integer in [low, high]; `default` when absent (None: required)."""
    if not _present(payload, name, default):
        assert default is not None
        return default
    value = payload[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"field {name!r} must be an integer")
    if not low <= value <= high:
        raise BadRequest(f"field {name!r} must be between {low} and {high}")
    return value


def number(payload: dict[str, Any], name: str, low: float, high: float,
           default: float | None = None) -> float:
    """A finite number in [low, high], as a float; `default` when absent (None: required)."""
    if not _present(payload, name, default):
        assert default is not None
        return default
    return _bounded(payload[name], low, high, f"field {name!r}")


def _bounded(value: Any, low: float, high: float, what: str) -> float:
    # Compared before any conversion: float() of a huge int raises OverflowError; an int
    # compares with a float exactly, and NaN fails both comparisons.
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not low <= value <= high:
        raise BadRequest(f"{what} must be a number between {low:g} and {high:g}")
    return float(value)


def string(payload: dict[str, Any], name: str, max_len: int = MAX_ID,
           default: str | None = None) -> str:
    """A string of at most `max_len` characters; `default` when absent (None: required)."""
    if not _present(payload, name, default):
        assert default is not None
        return default
    return _text(payload[name], max_len, f"field {name!r}")


def _text(value: Any, max_len: int, what: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{what} must be a string")
    if len(value) > max_len:
        raise BadRequest(f"{what} longer than {max_len} characters")
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:  # a lone surrogate ("\\ud800" in JSON): no file name,
            raise BadRequest(f"{what} is not valid Unicode") from None  # nor a log line
    return value


def text(payload: dict[str, Any], name: str, default: str | None = None) -> str:
    """A message (a failure's): a string, cut at MAX_TEXT characters."""
    return string(payload, name, protocol.MAX_BODY_BYTES, default)[:MAX_TEXT]


def flag(payload: dict[str, Any], name: str) -> bool:
    value = payload.get(name, False)
    if not isinstance(value, bool):
        raise BadRequest(f"field {name!r} must be true or false")
    return value


def obj(payload: dict[str, Any], name: str) -> dict[str, Any] | None:
    """A nested JSON object, or None when absent or null."""
    value = payload.get(name)
    if value is not None and not isinstance(value, dict):
        raise BadRequest(f"field {name!r} must be an object")
    return value


def items(payload: dict[str, Any], name: str, max_count: int) -> list[Any]:
    """A list of at most `max_count` items (an empty one when absent)."""
    value = payload.get(name, [])
    if not isinstance(value, list):
        raise BadRequest(f"field {name!r} must be a list")
    if len(value) > max_count:
        raise BadRequest(f"field {name!r} has more than {max_count} items")
    return value


def poll_timeout(payload: dict[str, Any]) -> float:
    """How long a long-poll may hold (0 when not given), at most MAX_POLL_S."""
    return min(protocol.MAX_POLL_S, number(payload, "timeout", 0.0, MAX_TIMEOUT_S, 0.0))


def seconds(payload: dict[str, Any], name: str, low: float = 0.0) -> float:
    """A duration a worker measured; required."""
    return number(payload, name, low, MAX_SECONDS)


def maybe_seconds(payload: dict[str, Any], name: str) -> float | None:
    """A duration a worker may not know: None when absent or null."""
    return None if payload.get(name) is None else seconds(payload, name)


def key(payload: dict[str, Any], name: str = "key") -> str:
    return string(payload, name, MAX_ID)


def keys(payload: dict[str, Any]) -> list[str]:
    value = payload.get("keys")
    if not isinstance(value, list):
        raise BadRequest("field 'keys' must be a list of strings")
    if len(value) > MAX_KEYS:
        raise BadRequest(f"field 'keys' has more than {MAX_KEYS} keys")
    return [_text(k, MAX_ID, "a key") for k in value]


def touched_keys(op: str, payload: dict[str, Any]) -> list[str]:
    """The store keys a KV operation reads or writes."""
    if op == "multi_get" and "set_key" in payload:  # a set carried by a fetch
        return [*keys(payload), key(payload, "set_key")]
    if op in ("wait", "multi_get", "check"):
        return keys(payload)
    if op in ("set", "get", "add", "compare_set", "delete"):
        return [key(payload)]
    return []


def amount(payload: dict[str, Any]) -> int:
    """A store counter's step."""
    return integer(payload, "amount", -MAX_AMOUNT - 1, MAX_AMOUNT)


def blob(payload: dict[str, Any], name: str) -> bytes:
    text_ = string(payload, name, protocol.MAX_BODY_BYTES)
    try:
        return base64.b64decode(text_, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"field {name!r} must be base64") from None


def b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def trace_events(payload: dict[str, Any]) -> list[Any]:
    """A worker's timeline events: their times bounded and their args plain JSON (the
    shape of each is checked where it becomes a trace event: trace_file.from_worker)."""
    events = items(payload, "events", MAX_EVENTS)
    for event in events:
        if isinstance(event, list) and len(event) == 7:
            _bounded(event[3], 0.0, MAX_TIME_US, "an event's ts")
            _bounded(event[4], 0.0, MAX_TIME_US, "an event's dur")
            plain_json(event[6], "an event's args")
    return events


def plain_json(value: Any, what: str) -> None:
    """BadRequest unless `value` nests at most MAX_DEPTH deep and holds finite numbers only
    (it is written out again: json refuses NaN, and recursion at depth, with errors of its
    own). Iterative: a deep value would make a recursive walk raise RecursionError."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise BadRequest(f"{what} must hold finite numbers")
        if isinstance(item, (dict, list)):
            if depth >= MAX_DEPTH:
                raise BadRequest(f"{what} nest deeper than {MAX_DEPTH}")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
