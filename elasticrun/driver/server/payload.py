"""Checking what a worker sent: every field of every endpoint is validated here, once."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from aiohttp import web

from elasticrun import protocol


class BadRequest(Exception):
    """The request is well signed but its content is not what the endpoint expects."""


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def field(payload: dict[str, Any], name: str, kind: type) -> Any:
    value = payload.get(name)
    if kind is int and isinstance(value, bool):
        raise BadRequest(f"field {name!r} must be an integer")
    if not isinstance(value, kind):
        raise BadRequest(f"field {name!r} must be {'an integer' if kind is int else 'a string'}")
    return value


def optional(payload: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    return field(payload, name, kind) if name in payload else default


def flag(payload: dict[str, Any], name: str) -> bool:
    value = payload.get(name, False)
    if not isinstance(value, bool):
        raise BadRequest(f"field {name!r} must be true or false")
    return value


def number(payload: dict[str, Any], name: str, default: float) -> float:
    value = payload.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise BadRequest(f"field {name!r} must be a number")
    return float(value)


def poll_timeout(payload: dict[str, Any]) -> float:
    return min(protocol.MAX_POLL_S, max(0.0, number(payload, "timeout", 0.0)))


def key(payload: dict[str, Any], name: str = "key") -> str:
    value = field(payload, name, str)
    if len(value) > 1024:
        raise BadRequest(f"{name} longer than 1024 characters")
    return value


def keys(payload: dict[str, Any]) -> list[str]:
    value = payload.get("keys")
    if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
        raise BadRequest("field 'keys' must be a list of strings")
    return value


def touched_keys(op: str, payload: dict[str, Any]) -> list[str]:
    """The store keys a KV operation reads or writes."""
    if op == "multi_get" and "set_key" in payload:  # a set carried by a fetch
        return [*keys(payload), key(payload, "set_key")]
    if op in ("wait", "multi_get", "check"):
        return keys(payload)
    if op in ("set", "get", "add", "compare_set", "delete"):
        return [key(payload)]
    return []


def blob(payload: dict[str, Any], name: str) -> bytes:
    text = field(payload, name, str)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"field {name!r} must be base64") from None


def b64(value: bytes) -> str:
    return base64.b64encode(value).decode()
