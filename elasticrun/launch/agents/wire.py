"""The agent channel: what `elasticrun agent` and the driver say to each other, as data.

One WebSocket per agent, opened by the agent (it connects out) at PATH on the driver's
server. The upgrade request is signed with the job's agent token (protocol/signing.py's HMAC
scheme: the token itself never crosses the network). Every message is one JSON object with
a "type"; `decode` validates it completely or raises BadMessage. A worker's environment
(which holds the job secret) travels sealed with AES-GCM under a key derived from the
token, so that someone reading the network learns neither.

agent -> driver: hello, started, start_failed, output, exited, inspected, drain, bye
driver -> agent: welcome, refused, start, stop, inspect, end
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from elasticrun.discovery.parsing import MAX_SLOTS_PER_HOST, check_host
from elasticrun.system.process_view import ProcessState

PATH = "/v1/agent"
REFUSED_HEADER = "X-Elasticrun-Refused"  # why an agent's connection was refused
VERSION = 1
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
MAX_OUTPUT_CHUNK = 64 * 1024  # bytes of worker output in one message
MAX_ID = 200  # characters of a worker or agent id
STREAMS = ("stdout", "stderr")


class BadMessage(ValueError):
    """A message that is not JSON, has no known type, or has a field of the wrong shape."""


# --- messages -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Hello:
    """First message of a connection. `workers`: those the agent still runs (a reconnect)."""

    TYPE: ClassVar[str] = "hello"
    host: str
    slots: int
    agent: str  # random per agent process: a reconnect is told apart from a second agent
    workers: tuple[str, ...] = ()
    draining: bool = False  # a reconnect of a draining agent
    version: int = VERSION


@dataclass(frozen=True)
class Welcome:
    """The driver took the agent. `stop`: workers of a reconnect the driver no longer has."""

    TYPE: ClassVar[str] = "welcome"
    job: str
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Refused:
    TYPE: ClassVar[str] = "refused"
    reason: str


@dataclass(frozen=True)
class Start:
    TYPE: ClassVar[str] = "start"
    worker: str
    command: tuple[str, ...]
    cwd: str
    env: str  # sealed: see seal()


@dataclass(frozen=True)
class Started:
    TYPE: ClassVar[str] = "started"
    worker: str
    pid: int


@dataclass(frozen=True)
class StartFailed:
    TYPE: ClassVar[str] = "start_failed"
    worker: str
    error: str


@dataclass(frozen=True)
class Output:
    TYPE: ClassVar[str] = "output"
    worker: str
    stream: str  # stdout | stderr
    data: str  # base64; "" with eof
    eof: bool = False


@dataclass(frozen=True)
class Exited:
    TYPE: ClassVar[str] = "exited"
    worker: str
    code: int


@dataclass(frozen=True)
class Stop:
    TYPE: ClassVar[str] = "stop"
    worker: str
    grace: float


@dataclass(frozen=True)
class Inspect:
    """The worker may be hung: what is its process doing (system/process_view.py)?"""

    TYPE: ClassVar[str] = "inspect"
    worker: str


@dataclass(frozen=True)
class Inspected:
    TYPE: ClassVar[str] = "inspected"
    worker: str
    state: str  # a ProcessState value
    detail: str = ""


@dataclass(frozen=True)
class Drain:
    """The agent was told to go (SIGTERM): its workers should leave at the next commit."""

    TYPE: ClassVar[str] = "drain"


@dataclass(frozen=True)
class Bye:
    """A drained agent whose workers have all left, about to exit 0."""

    TYPE: ClassVar[str] = "bye"


@dataclass(frozen=True)
class End:
    """The job is over: stop what is left and exit 0. `reason`: why it failed, if it did
    (every node says so, as torchrun's agents do)."""

    TYPE: ClassVar[str] = "end"
    code: int = 0
    reason: str = ""


Message = (Hello | Welcome | Refused | Start | Started | StartFailed | Output | Exited | Stop
           | Inspect | Inspected | Drain | Bye | End)
_TYPES: dict[str, type[Any]] = {cls.TYPE: cls for cls in (
    Hello, Welcome, Refused, Start, Started, StartFailed, Output, Exited, Stop, Inspect,
    Inspected, Drain, Bye, End)}


def encode(message: Message) -> str:
    body: dict[str, Any] = {"type": message.TYPE}
    for field in fields(message):
        value = getattr(message, field.name)
        body[field.name] = list(value) if isinstance(value, tuple) else value
    return json.dumps(body, separators=(",", ":"))


def decode(text: str | bytes) -> Message:
    if len(text) > MAX_MESSAGE_BYTES:
        raise BadMessage("message too large")
    try:
        body = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise BadMessage("not JSON") from None
    if not isinstance(body, dict):
        raise BadMessage("not a JSON object")
    cls = _TYPES.get(body.get("type"))  # type: ignore[arg-type]
    if cls is None:
        raise BadMessage(f"unknown message type {str(body.get('type'))[:40]!r}")
    values = {}
    for field in fields(cls):
        if field.name not in body:
            if field.default is MISSING:
                raise BadMessage(f"{cls.TYPE}: missing {field.name!r}")
            continue
        values[field.name] = _check(cls.TYPE, field.name, field.type, body[field.name])
    message = cls(**values)
    _validate(message)
    return message  # type: ignore[no-any-return]


def _check(kind: str, name: str, annotation: Any, value: Any) -> Any:
    """Field types as written in the dataclasses above (annotations are strings here)."""
    ok = {
        "str": isinstance(value, str),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "tuple[str, ...]": isinstance(value, list) and all(isinstance(v, str) for v in value),
    }.get(str(annotation), False)
    if not ok:
        raise BadMessage(f"{kind}: {name!r} must be {annotation}")
    return tuple(value) if isinstance(value, list) else value


def _validate(message: Message) -> None:
    """What the types alone do not say."""
    worker = getattr(message, "worker", None)
    if worker is not None and not 0 < len(worker) <= MAX_ID:
        raise BadMessage(f"{message.TYPE}: 'worker' must be 1..{MAX_ID} characters")
    if isinstance(message, Hello):
        try:
            check_host(message.host)
        except ValueError as exc:
            raise BadMessage(f"hello: host {message.host[:60]!r}: {exc}") from None
        if not 1 <= message.slots <= MAX_SLOTS_PER_HOST:
            raise BadMessage(f"hello: 'slots' must be at least 1 and at most "
                             f"{MAX_SLOTS_PER_HOST}")
        if not 0 < len(message.agent) <= MAX_ID or len(message.workers) > 4096:
            raise BadMessage("hello: bad 'agent' or 'workers'")
    elif isinstance(message, Start) and not message.command:
        raise BadMessage("start: empty 'command'")
    elif isinstance(message, Output):
        if message.stream not in STREAMS:
            raise BadMessage(f"output: 'stream' must be one of {', '.join(STREAMS)}")
        if len(message.data) > 2 * MAX_OUTPUT_CHUNK:
            raise BadMessage("output: chunk too large")
    elif isinstance(message, Stop) and not 0 <= message.grace <= 3600:
        raise BadMessage("stop: 'grace' must be 0..3600 seconds")
    elif isinstance(message, Inspected) and (
            message.state not in {s.value for s in ProcessState} or len(message.detail) > 200):
        raise BadMessage("inspected: 'state' must be a process state, 'detail' short")


def output_chunk(worker: str, stream: str, data: bytes) -> Output:
    return Output(worker, stream, base64.b64encode(data).decode("ascii"), eof=not data)


def output_bytes(message: Output) -> bytes:
    try:
        return base64.b64decode(message.data, validate=True)
    except (binascii.Error, ValueError):
        raise BadMessage("output: 'data' is not base64") from None


# --- the sealed environment -------------------------------------------------------------------
def _key(token: str) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=b"elasticrun agent worker environment v1").derive(token.encode())


def seal(token: str, worker: str, env: Mapping[str, str]) -> str:
    """The environment, encrypted and bound to its worker id."""
    nonce = os.urandom(12)
    sealed = AESGCM(_key(token)).encrypt(nonce, json.dumps(dict(env)).encode(),
                                         worker.encode())
    return base64.b64encode(nonce + sealed).decode("ascii")


def unseal(token: str, worker: str, sealed: str) -> dict[str, str]:
    """Raises BadMessage when the environment was not sealed with this token for `worker`."""
    try:
        raw = base64.b64decode(sealed, validate=True)
        plain = AESGCM(_key(token)).decrypt(raw[:12], raw[12:], worker.encode())
        env = json.loads(plain)
    except (binascii.Error, ValueError, InvalidTag):
        raise BadMessage("start: the environment is not sealed with this agent's token") \
            from None
    if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise BadMessage("start: the environment must map names to strings")
    return env
