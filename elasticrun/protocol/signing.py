"""Signing requests with the job's secret: HMAC-SHA256 over method, path, time, nonce and
the body's digest; a guard that refuses forged, stale and replayed requests."""

from __future__ import annotations

import functools
import hashlib
import hmac
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping

from elasticrun.protocol.http import (
    HEADER_BODY_DIGEST,
    HEADER_NONCE,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    SIGNATURE_WINDOW_S,
)


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
