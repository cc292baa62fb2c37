"""The contract between driver and workers: env-var names, URL paths, message shapes, signing.

Shared by both sides, so it imports neither torch nor aiohttp.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import hmac
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Worker environment (public names, see DESIGN.md).
ENV_HOSTNAME = "ELASTICRUN_HOSTNAME"
ENV_RANK = "ELASTICRUN_RANK"
ENV_SIZE = "ELASTICRUN_SIZE"
ENV_LOCAL_RANK = "ELASTICRUN_LOCAL_RANK"
ENV_LOCAL_SIZE = "ELASTICRUN_LOCAL_SIZE"
ENV_CROSS_RANK = "ELASTICRUN_CROSS_RANK"
ENV_CROSS_SIZE = "ELASTICRUN_CROSS_SIZE"
ENV_RENDEZVOUS_ADDR = "ELASTICRUN_RENDEZVOUS_ADDR"
ENV_RENDEZVOUS_PORT = "ELASTICRUN_RENDEZVOUS_PORT"
# Horovod's launcher sets these (values at spawn, never updated); scripts written for
# horovodrun read them, e.g. HOROVOD_RANK as "the rank this process started with".
HOROVOD_ENV_PREFIX = "HOROVOD_"
HOROVOD_ELASTIC = "HOROVOD_ELASTIC"
# Internal: who this process is, the job secret, and worker-side timeouts.
ENV_WORKER_ID = "ELASTICRUN_WORKER_ID"
ENV_SECRET = "ELASTICRUN_SECRET"
ENV_COLLECTIVE_TIMEOUT = "ELASTICRUN_COLLECTIVE_TIMEOUT"
ENV_ROUND_TIMEOUT = "ELASTICRUN_ROUND_TIMEOUT"
ENV_DRIVER_TIMEOUT = "ELASTICRUN_DRIVER_TIMEOUT"
# "0": this worker does not report stalled collectives (--no-hang-detection).
ENV_HANG_DETECTION = "ELASTICRUN_HANG_DETECTION"
ENV_STRAGGLERS = "ELASTICRUN_STRAGGLERS"  # --stragglers: off stops the pace reports
# --backend auto|gloo|nccl (for CUDA tensors), and the CUDA device a worker is pinned to.
ENV_BACKEND = "ELASTICRUN_BACKEND"
# "1" when the job's membership may change (--min-np, --max-np, discovery), else "0".
ENV_ELASTIC = "ELASTICRUN_ELASTIC"
ENV_CUDA_DEVICE = "ELASTICRUN_CUDA_DEVICE"
# The round a worker was started for: a script that never calls er.init() stays in it, and
# its foothold (worker/foothold.py) reports for it.
ENV_ROUND = "ELASTICRUN_ROUND"
# Modules a worker template imports besides torch (comma-separated); "0" also turns off
# the imports it takes from the script itself (worker/preload.py).
ENV_PRELOAD = "ELASTICRUN_PRELOAD"
# --timeline-filename: record from init() on ("1"), with a CYCLE mark per optimizer step.
ENV_TIMELINE = "ELASTICRUN_TIMELINE"
ENV_TIMELINE_MARK_CYCLES = "ELASTICRUN_TIMELINE_MARK_CYCLES"
DEFAULT_DRIVER_TIMEOUT_S = 300.0  # --driver-grace
# The operator's secrets: read by the driver, never passed on to workers.
ENV_WEBHOOK_TOKEN = "ELASTICRUN_WEBHOOK_TOKEN"
ENV_EVENT_SECRET = "ELASTICRUN_EVENT_SECRET"
ENV_AGENT_TOKEN = "ELASTICRUN_AGENT_TOKEN"  # authenticates `elasticrun agent`s to the driver
# Where commits are kept (torch/elastic/keeper.py): the host snapshot directory ("": none),
# --checkpoint-dir ("": none) and --checkpoint-interval; "1" in ENV_RESTORE: the worker was
# started to replace workers that were all lost, so its round must restore a kept commit.
ENV_SNAPSHOT_DIR = "ELASTICRUN_SNAPSHOT_DIR"
ENV_CHECKPOINT_DIR = "ELASTICRUN_CHECKPOINT_DIR"
ENV_CHECKPOINT_INTERVAL = "ELASTICRUN_CHECKPOINT_INTERVAL"
ENV_RESTORE = "ELASTICRUN_RESTORE"
# --shard-size: workers per replica group (elastic HSDP); the same for every worker of a job.
ENV_SHARD_SIZE = "ELASTICRUN_SHARD_SIZE"
# "0": local workers are exec'd, never forked from a worker template (launch/forked.py).
ENV_WORKER_TEMPLATE = "ELASTICRUN_WORKER_TEMPLATE"


class HostUpdateResult(enum.IntFlag):
    """What a host-change notice announces; Horovod's names and values
    (horovod/runner/elastic/worker.py), so that scripts comparing them keep working."""

    no_update = 0
    removed = 1
    added = 2
    mixed = removed | added


@dataclass(frozen=True)
class Notice:
    """A host-change notice: its sequence number, when the driver posted it (whole seconds
    since the epoch, as Horovod stamps its notifications) and what changed."""

    seq: int
    timestamp: int
    update: HostUpdateResult

    def to_json(self) -> list[int]:
        return [self.seq, self.timestamp, int(self.update)]

    @classmethod
    def from_json(cls, data: Any) -> Notice:
        seq, timestamp, update = data
        return cls(int(seq), int(timestamp), HostUpdateResult(int(update)))


# URL paths of the driver's server.
PATH_JOIN = "/v1/rendezvous/join"
PATH_NOTICES = "/v1/rendezvous/notices"
PATH_SYNCED = "/v1/rendezvous/synced"  # a worker holds the committed state of its round
PATH_TRAINED = "/v1/rendezvous/trained"  # a worker completed its first commit: it works
PATH_FAILING = "/v1/rendezvous/failing"  # a worker's own error ends it: it is about to exit
PATH_STALLED = "/v1/rendezvous/stalled"  # a collective waits far longer than usual
PATH_INIT = "/v1/rendezvous/init"  # a worker's script calls er.init(): no restart mode
PATH_TIMELINE = "/v1/timeline"  # a worker's trace events; opens the job's trace file
PATH_FLASH = "/v1/flash"  # a worker's flash commit cadence (elasticrun.flash)
PATH_PACE = "/v1/rendezvous/pace"  # a member's busy share outside collectives (stragglers)
PATH_KV_PREFIX = "/v1/kv/"
KV_OPS = ("set", "get", "add", "compare_set", "check", "delete", "num_keys", "wait", "multi_get")
# elasticrun.run(func): the cloudpickled (func, args, kwargs) out, each worker's result in,
# in parts of RESULT_PART_BYTES (base64 in JSON, a part stays under MAX_BODY_BYTES).
PATH_RUN_FUNCTION = "/v1/run/function"
PATH_RUN_RESULT = "/v1/run/result"
RESULT_PART_BYTES = 2 * 1024 * 1024

# Request signing.
HEADER_TIMESTAMP = "X-Elasticrun-Timestamp"
HEADER_NONCE = "X-Elasticrun-Nonce"
HEADER_SIGNATURE = "X-Elasticrun-Signature"
# The body's SHA-256 (hex): the signature covers it instead of the body, so the driver checks
# a request's signature from its headers alone, before reading (buffering) any of its body.
# Absent: the body is empty (a signed GET).
HEADER_BODY_DIGEST = "X-Elasticrun-Body-Digest"
# Every answer of the driver carries its epoch (the journal bumps it on each resume): a
# worker never obeys a driver older than one it has heard (a stale driver that woke up).
HEADER_EPOCH = "X-Elasticrun-Driver-Epoch"
SIGNATURE_WINDOW_S = 30.0
MAX_BODY_BYTES = 4 * 1024 * 1024
# Upper bound of one long-poll; clients re-ask after it, so no HTTP call waits unboundedly.
MAX_POLL_S = 30.0

# Store keys of round N live under this prefix, so nothing leaks between rounds.
def round_prefix(round_number: int) -> str:
    return f"elasticrun/round{round_number}/"


def round_of_key(key: str) -> int | None:
    """The round a store key belongs to (it starts with round_prefix(n)), if any."""
    head, sep, _ = key.partition("/round")
    if head != "elasticrun" or not sep:
        return None
    number, slash, _ = key[len("elasticrun/round"):].partition("/")
    return int(number) if slash and number.isdigit() and len(number) < 10 else None


def new_secret() -> str:
    return secrets.token_hex(32)


def new_nonce() -> str:
    return secrets.token_hex(12)


@functools.lru_cache(maxsize=8)
def _keyed_mac(secret: str) -> hmac.HMAC:
    """The HMAC keyed with `secret`, before any message: copying it skips the key schedule
    that every request would otherwise repeat (about half of a small request's signing)."""
    return hmac.new(secret.encode(), digestmod=hashlib.sha256)


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


EMPTY_BODY_DIGEST = body_digest(b"")


def signature(secret: str, method: str, path: str, timestamp: str, nonce: str, body: bytes) -> str:
    """HMAC-SHA256 over method, path (with query), timestamp, nonce and the body's digest
    (body_digest), each followed by a newline."""
    return digest_signature(secret, method, path, timestamp, nonce, body_digest(body))


def digest_signature(secret: str, method: str, path: str, timestamp: str, nonce: str,
                     digest: str) -> str:
    """signature() of a body known by its digest only (the header a request names)."""
    mac = _keyed_mac(secret).copy()
    mac.update(f"{method.upper()}\n{path}\n{timestamp}\n{nonce}\n{digest}\n".encode())
    return mac.hexdigest()


def sign_headers(secret: str, method: str, path: str, body: bytes) -> dict[str, str]:
    timestamp = f"{time.time():.6f}"
    nonce = new_nonce()
    digest = body_digest(body)
    return {
        HEADER_TIMESTAMP: timestamp,
        HEADER_NONCE: nonce,
        HEADER_BODY_DIGEST: digest,
        HEADER_SIGNATURE: digest_signature(secret, method, path, timestamp, nonce, digest),
    }


def verify_signature(
    secret: str,
    method: str,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
    now: float,
    window_s: float = SIGNATURE_WINDOW_S,
) -> str | None:
    """Returns None when the request is authentic and fresh, else the reason it is refused."""
    digest = body_digest(body)
    claimed = headers.get(HEADER_BODY_DIGEST)
    reason = verify_headers(secret, method, path, {**headers, HEADER_BODY_DIGEST: digest},
                            now, window_s)
    if reason is None and claimed is not None and not hmac.compare_digest(
            claimed.encode(errors="replace"), digest.encode()):
        return "bad signature"  # not of this body
    return reason


def verify_headers(
    secret: str,
    method: str,
    path: str,
    headers: Mapping[str, str],
    now: float,
    window_s: float = SIGNATURE_WINDOW_S,
) -> str | None:
    """verify_signature() from the headers alone, for the body the digest header names (the
    reader of the body checks that it is that body)."""
    timestamp = headers.get(HEADER_TIMESTAMP, "")
    nonce = headers.get(HEADER_NONCE, "")
    given = headers.get(HEADER_SIGNATURE, "")
    digest = headers.get(HEADER_BODY_DIGEST) or EMPTY_BODY_DIGEST
    if not (timestamp and nonce and given):
        return "unsigned request"
    if not (timestamp.isascii() and nonce.isascii() and given.isascii() and digest.isascii()):
        return "malformed signature headers"
    try:
        sent_at = float(timestamp)
    except ValueError:
        return "malformed timestamp"
    if not math.isfinite(sent_at) or abs(now - sent_at) > window_s:
        return "stale request"
    expected = digest_signature(secret, method, path, timestamp, nonce, digest)
    if not hmac.compare_digest(expected, given):
        return "bad signature"
    return None


class SignatureGuard:
    """Checks the requests signed with one key: authentic, fresh, and each nonce seen once
    within the window (a replay is refused)."""

    def __init__(self, secret: str) -> None:
        self._secret = secret
        self._seen_nonces: OrderedDict[str, float] = OrderedDict()

    def check(self, method: str, path: str, body: bytes, headers: Mapping[str, str],
              now: float) -> str | None:
        """None when the request passes (its nonce is then spent); else why it is refused."""
        reason = verify_signature(self._secret, method, path, body, _signed(headers), now)
        return reason if reason is not None else self.spend(headers, now)

    def check_headers(self, method: str, path: str, headers: Mapping[str, str],
                      now: float) -> str | None:
        """check() before the body is read: the signature over the body's digest header, and
        the nonce not spent yet. The nonce stays unspent: spend() it once the body read
        matches the digest (an outsider who saw the headers cannot spend it with another
        body)."""
        reason = verify_headers(self._secret, method, path, _signed(headers), now)
        if reason is None and headers.get(HEADER_NONCE, "") in self._live_nonces(now):
            return "replayed request"
        return reason

    def spend(self, headers: Mapping[str, str], now: float) -> str | None:
        """Records the nonce of a request that passed; "replayed request" if it was spent."""
        nonce = headers.get(HEADER_NONCE, "")
        seen = self._live_nonces(now)
        if nonce in seen:
            return "replayed request"
        seen[nonce] = now + 2 * SIGNATURE_WINDOW_S
        return None

    def _live_nonces(self, now: float) -> OrderedDict[str, float]:
        while self._seen_nonces:
            oldest, expiry = next(iter(self._seen_nonces.items()))
            if expiry > now:
                break
            del self._seen_nonces[oldest]
        return self._seen_nonces


def _signed(headers: Mapping[str, str]) -> dict[str, str]:
    """The signature's headers of a request (a plain dict of them, "" where absent; the
    digest only where present)."""
    signed = {key: headers.get(key, "") for key in (
        HEADER_TIMESTAMP, HEADER_NONCE, HEADER_SIGNATURE)}
    digest = headers.get(HEADER_BODY_DIGEST)
    if digest is not None:
        signed[HEADER_BODY_DIGEST] = digest
    return signed


@dataclass(frozen=True)
class SlotInfo:
    """Where one worker stands in one round."""

    hostname: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int

    def to_json(self) -> dict[str, Any]:
        # Built directly: dataclasses.asdict (recursive, deep-copying) costs ~25x more, once
        # per join (tests/unit/test_protocol.py checks the two agree).
        return {"hostname": self.hostname, "rank": self.rank, "size": self.size,
                "local_rank": self.local_rank, "local_size": self.local_size,
                "cross_rank": self.cross_rank, "cross_size": self.cross_size}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SlotInfo:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class JoinReply:
    """The driver's answer to a worker asking for its place in the next round.

    `action` is "run" (slot holds this round's place), "exit" (this worker has no
    place any more and should end cleanly) or "retry" (the long-poll expired; ask again).
    """

    action: str
    round: int = 0
    slot: SlotInfo | None = None
    notice_seq: int = 0
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "round": self.round,
            "slot": self.slot.to_json() if self.slot else None,
            "notice_seq": self.notice_seq,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JoinReply:
        slot = data.get("slot")
        return cls(
            action=str(data["action"]),
            round=int(data.get("round", 0)),
            slot=SlotInfo.from_json(slot) if slot else None,
            notice_seq=int(data.get("notice_seq", 0)),
            reason=str(data.get("reason", "")),
        )
