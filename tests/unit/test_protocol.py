"""Unit tests for elasticrun.protocol: request signing and message shapes."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from elasticrun.protocol import (
    HEADER_BODY_DIGEST,
    HEADER_NONCE,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    SIGNATURE_WINDOW_S,
    JoinReply,
    SlotInfo,
    new_nonce,
    new_secret,
    round_prefix,
    sign_headers,
    signature,
    verify_signature,
)

SECRET = "0123456789abcdef" * 4
METHOD = "POST"
PATH = "/v1/kv/set?key=elasticrun%2Fround1%2Fx"
BODY = b'{"value": "aGVsbG8="}'


def signed() -> dict[str, str]:
    return sign_headers(SECRET, METHOD, PATH, BODY)


def sent_at(headers: dict[str, str]) -> float:
    return float(headers[HEADER_TIMESTAMP])


def test_sign_headers_shape() -> None:
    before = time.time()
    headers = signed()
    after = time.time()
    assert set(headers) == {HEADER_TIMESTAMP, HEADER_NONCE, HEADER_SIGNATURE,
                            HEADER_BODY_DIGEST}
    assert before - 1e-6 <= sent_at(headers) <= after + 1e-6
    assert len(headers[HEADER_SIGNATURE]) == 64
    int(headers[HEADER_SIGNATURE], 16)
    assert headers[HEADER_NONCE]
    assert signed()[HEADER_NONCE] != headers[HEADER_NONCE]


def test_round_trip_accepted() -> None:
    headers = signed()
    assert verify_signature(SECRET, METHOD, PATH, BODY, headers, now=time.time()) is None


def test_round_trip_empty_body_and_get() -> None:
    headers = sign_headers(SECRET, "GET", "/v1/rendezvous/notices?after=3", b"")
    assert (
        verify_signature(
            SECRET, "GET", "/v1/rendezvous/notices?after=3", b"", headers, now=sent_at(headers)
        )
        is None
    )


def test_method_case_does_not_matter() -> None:
    headers = sign_headers(SECRET, "post", PATH, BODY)
    assert verify_signature(SECRET, "POST", PATH, BODY, headers, now=sent_at(headers)) is None


@pytest.mark.parametrize(
    ("secret", "method", "path", "body"),
    [
        ("another secret", METHOD, PATH, BODY),
        (SECRET, "GET", PATH, BODY),
        (SECRET, "PUT", PATH, BODY),
        (SECRET, METHOD, "/v1/kv/get?key=elasticrun%2Fround1%2Fx", BODY),
        (SECRET, METHOD, PATH + "&x=1", BODY),
        (SECRET, METHOD, "/v1/kv/set", BODY),
        (SECRET, METHOD, PATH, BODY + b" "),
        (SECRET, METHOD, PATH, b""),
        (SECRET, METHOD, PATH, BODY.replace(b"aGVs", b"aGVt")),
    ],
)
def test_changed_request_refused(secret: str, method: str, path: str, body: bytes) -> None:
    headers = signed()
    reason = verify_signature(secret, method, path, body, headers, now=sent_at(headers))
    assert reason == "bad signature"


def test_changed_timestamp_refused() -> None:
    headers = signed()
    moved = f"{sent_at(headers) + 1.0:.6f}"
    tampered = {**headers, HEADER_TIMESTAMP: moved}
    assert (
        verify_signature(SECRET, METHOD, PATH, BODY, tampered, now=sent_at(headers))
        == "bad signature"
    )


def test_changed_nonce_refused() -> None:
    headers = signed()
    tampered = {**headers, HEADER_NONCE: new_nonce()}
    assert (
        verify_signature(SECRET, METHOD, PATH, BODY, tampered, now=sent_at(headers))
        == "bad signature"
    )


def test_changed_signature_refused() -> None:
    headers = signed()
    sig = headers[HEADER_SIGNATURE]
    flipped = ("0" if sig[0] != "0" else "1") + sig[1:]
    for bad in (flipped, sig[:-1], sig.upper(), "x"):
        tampered = {**headers, HEADER_SIGNATURE: bad}
        assert (
            verify_signature(SECRET, METHOD, PATH, BODY, tampered, now=sent_at(headers))
            == "bad signature"
        )


@pytest.mark.parametrize("offset", [SIGNATURE_WINDOW_S + 0.5, -(SIGNATURE_WINDOW_S + 0.5), 1e6])
def test_stale_timestamp_refused(offset: float) -> None:
    headers = signed()
    now = sent_at(headers) + offset
    assert verify_signature(SECRET, METHOD, PATH, BODY, headers, now=now) == "stale request"


@pytest.mark.parametrize("offset", [0.0, SIGNATURE_WINDOW_S - 0.5, -(SIGNATURE_WINDOW_S - 0.5)])
def test_within_window_accepted(offset: float) -> None:
    headers = signed()
    now = sent_at(headers) + offset
    assert verify_signature(SECRET, METHOD, PATH, BODY, headers, now=now) is None


def test_custom_window() -> None:
    headers = signed()
    now = sent_at(headers) + 5.0
    assert verify_signature(SECRET, METHOD, PATH, BODY, headers, now=now, window_s=10) is None
    assert (
        verify_signature(SECRET, METHOD, PATH, BODY, headers, now=now, window_s=1)
        == "stale request"
    )


def test_stale_check_uses_signed_timestamp_even_if_signature_is_valid() -> None:
    # A correctly signed, old request (a replay) is refused.
    ts = f"{time.time() - 3600:.6f}"
    nonce = new_nonce()
    headers = {
        HEADER_TIMESTAMP: ts,
        HEADER_NONCE: nonce,
        HEADER_SIGNATURE: signature(SECRET, METHOD, PATH, ts, nonce, BODY),
    }
    assert verify_signature(SECRET, METHOD, PATH, BODY, headers, now=time.time()) == "stale request"
    assert verify_signature(SECRET, METHOD, PATH, BODY, headers, now=float(ts)) is None


@pytest.mark.parametrize("missing", [HEADER_TIMESTAMP, HEADER_NONCE, HEADER_SIGNATURE])
def test_missing_header_unsigned(missing: str) -> None:
    headers = signed()
    del headers[missing]
    assert (
        verify_signature(SECRET, METHOD, PATH, BODY, headers, now=time.time()) == "unsigned request"
    )


@pytest.mark.parametrize("empty", [HEADER_TIMESTAMP, HEADER_NONCE, HEADER_SIGNATURE])
def test_empty_header_unsigned(empty: str) -> None:
    headers = {**signed(), empty: ""}
    assert (
        verify_signature(SECRET, METHOD, PATH, BODY, headers, now=time.time()) == "unsigned request"
    )


def test_no_headers_unsigned() -> None:
    assert verify_signature(SECRET, METHOD, PATH, BODY, {}, now=time.time()) == "unsigned request"


def test_malformed_timestamp() -> None:
    headers = {**signed(), HEADER_TIMESTAMP: "yesterday"}
    assert (
        verify_signature(SECRET, METHOD, PATH, BODY, headers, now=time.time())
        == "malformed timestamp"
    )


def test_signature_is_deterministic_hmac() -> None:
    one = signature(SECRET, "post", PATH, "1.000000", "n", BODY)
    assert one == signature(SECRET, "POST", PATH, "1.000000", "n", BODY)
    # Parts are delimited, so moving bytes between fields changes the MAC.
    assert signature(SECRET, "POST", "/a", "1", "n", b"") != signature(
        SECRET, "POST", "/", "a1", "n", b""
    )


def test_new_secret_and_nonce_are_random_hex() -> None:
    assert len(new_secret()) == 64
    assert new_secret() != new_secret()
    int(new_secret(), 16)
    int(new_nonce(), 16)
    assert new_nonce() != new_nonce()


def test_round_prefix() -> None:
    assert round_prefix(1) == "elasticrun/round1/"
    assert not round_prefix(10).startswith(round_prefix(1))


# --------------------------------------------------------------------------- messages

SLOT = SlotInfo(
    hostname="node2", rank=5, size=8, local_rank=1, local_size=4, cross_rank=1, cross_size=2
)


def test_slot_info_round_trip() -> None:
    data = SLOT.to_json()
    assert data == {
        "hostname": "node2",
        "rank": 5,
        "size": 8,
        "local_rank": 1,
        "local_size": 4,
        "cross_rank": 1,
        "cross_size": 2,
    }
    assert data == dataclasses.asdict(SLOT)  # to_json names every field, a new one too
    assert SlotInfo.from_json(json.loads(json.dumps(data))) == SLOT


def test_slot_info_from_json_ignores_extra_keys_and_needs_all_fields() -> None:
    assert SlotInfo.from_json({**SLOT.to_json(), "future_field": 1}) == SLOT
    data = SLOT.to_json()
    del data["cross_size"]
    with pytest.raises(KeyError):
        SlotInfo.from_json(data)


@pytest.mark.parametrize(
    "reply",
    [
        JoinReply(action="run", round=3, slot=SLOT, notice_seq=7, reason=""),
        JoinReply(action="exit", round=4, slot=None, notice_seq=0, reason="no place for you"),
        JoinReply(action="retry"),
    ],
)
def test_join_reply_round_trip(reply: JoinReply) -> None:
    wire = json.loads(json.dumps(reply.to_json()))
    assert JoinReply.from_json(wire) == reply


def test_join_reply_to_json_shape() -> None:
    data = JoinReply(action="run", round=2, slot=SLOT, notice_seq=1).to_json()
    assert data == {
        "action": "run",
        "round": 2,
        "slot": SLOT.to_json(),
        "notice_seq": 1,
        "reason": "",
    }
    assert JoinReply(action="retry").to_json()["slot"] is None


def test_join_reply_from_json_defaults() -> None:
    reply = JoinReply.from_json({"action": "retry"})
    assert reply == JoinReply(action="retry", round=0, slot=None, notice_seq=0, reason="")
