"""A deterministic fuzz of the worker routes, by the categories of a fuzz of a running job:
wrong methods, random paths, malformed JSON signed with the real secret, replayed
signatures, bad timestamps. Each answer is a 4xx, nothing changes, and the server still
answers a good request afterwards. (test_routes_property.py: arbitrary JSON bodies.)
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from yarl import URL

from elasticrun import protocol
from tests.rounds_server import RoundsServer
from tests.worker_routes import SECRET, VALID, job, snapshot, still_serves

pytestmark = pytest.mark.timeout(60)

ROUTES = sorted(VALID)
SEED = 55


@pytest.fixture
async def rv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[RoundsServer]:
    monkeypatch.setattr(protocol, "MAX_POLL_S", 0.2)
    async with job(tmp_path / "trace.json") as server:
        yield server


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


async def send(session: aiohttp.ClientSession, rv: RoundsServer, method: str, path: str,
               body: bytes = b"", headers: dict[str, str] | None = None) -> tuple[int, str]:
    url = URL(f"http://127.0.0.1:{rv.port}{path}", encoded=True)
    async with session.request(method, url, data=body, headers=headers or {},
                               timeout=aiohttp.ClientTimeout(total=10)) as response:
        return response.status, await response.text()


def signed(method: str, path: str, body: bytes) -> dict[str, str]:
    return protocol.sign_headers(SECRET, method, path, body)


def signed_at(timestamp: str, path: str, body: bytes) -> dict[str, str]:
    """Signed with the job's secret, over `timestamp` as given."""
    nonce = protocol.new_nonce()
    return {protocol.HEADER_TIMESTAMP: timestamp, protocol.HEADER_NONCE: nonce,
            protocol.HEADER_SIGNATURE: protocol.signature(SECRET, "POST", path, timestamp,
                                                          nonce, body)}


def valid(path: str) -> bytes:
    return json.dumps(VALID[path]).encode()


async def test_wrong_methods(session: aiohttp.ClientSession, rv: RoundsServer) -> None:
    before = snapshot(rv)
    for path in ROUTES:
        for method in ("GET", "PUT", "DELETE", "PATCH", "OPTIONS"):
            body = valid(path)
            status, text = await send(session, rv, method, path, body,
                                      signed(method, path, body))
            assert status == 405, (method, path, status, text)
            status, _ = await send(session, rv, method, path, body)
            assert 400 <= status < 500, (method, path, status)
    assert snapshot(rv) == before
    await still_serves(session, rv)


async def test_random_paths(session: aiohttp.ClientSession, rv: RoundsServer) -> None:
    rng = random.Random(SEED)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789_-./%~"
    before = snapshot(rv)
    for _ in range(60):
        tail = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        path = rng.choice(["/", "/v1/", "/v1/kv/", "/v1/rendezvous/", "/v1/run/"]) + tail
        if path in VALID:
            continue
        body = json.dumps({"worker": "tester", "worker_id": "w0"}).encode()
        status, text = await send(session, rv, "POST", path, body, signed("POST", path, body))
        assert 400 <= status < 500, (path, status, text)
        status, _ = await send(session, rv, "POST", path, body)
        assert 400 <= status < 500, (path, status)
    assert snapshot(rv) == before
    await still_serves(session, rv)


MALFORMED = [b"{", b"[1,", b'{"a": NaN', b"\xff\xfe{}", b'{"worker_id": "w0"', b"null",
             b"1e400", b"[]", b'"text"', b"[" * 50_000, b'{"a": 1}garbage', b"{'a': 1}",
             b"\xef\xbb\xbf{}", b'{"a": "\\ud800"', b"0" * 5000, b"9" * 5000, b"{}" * 100,
             b'{"a": 1, "a": ' + b"1" * 5000 + b"}", b"\x00", b"   "]


async def test_malformed_json_signed_with_the_real_secret(
        session: aiohttp.ClientSession, rv: RoundsServer) -> None:
    before = snapshot(rv)
    for path in ROUTES:
        for body in MALFORMED:
            status, text = await send(session, rv, "POST", path, body,
                                      signed("POST", path, body))
            assert 400 <= status < 500, (path, body[:40], status, text)
    assert snapshot(rv) == before
    await still_serves(session, rv)


async def test_replayed_signatures(session: aiohttp.ClientSession, rv: RoundsServer) -> None:
    path = protocol.PATH_KV_PREFIX + "set"
    body = json.dumps({"worker": "tester", "key": "k", "value": "MQ=="}).encode()
    headers = signed("POST", path, body)
    assert (await send(session, rv, "POST", path, body, headers))[0] == 200
    before = snapshot(rv)
    other = json.dumps({"worker": "tester", "key": "k", "value": "Mg=="}).encode()
    for replay_path, replay_body in [(path, body), (path, body), (path, other),
                                     (protocol.PATH_KV_PREFIX + "delete", body),
                                     (protocol.PATH_FAILING, body)]:
        status, text = await send(session, rv, "POST", replay_path, replay_body, headers)
        assert status == 401, (replay_path, status, text)
    assert snapshot(rv) == before
    await still_serves(session, rv)


async def test_bad_timestamps(session: aiohttp.ClientSession, rv: RoundsServer) -> None:
    now = time.time()
    stamps = ["", "nan", "NaN", "inf", "-inf", "1e400", "-1e400", "9" * 5000, "0", "-1",
              f"{now - 3600:.6f}", f"{now + 3600:.6f}", "0x10", f" {now} ", "1_000",
              f"{now}garbage", "\t"]
    before = snapshot(rv)
    for path in ROUTES:
        body = valid(path)
        for stamp in stamps:
            status, text = await send(session, rv, "POST", path, body,
                                      signed_at(stamp, path, body))
            assert status == 401, (path, stamp[:20], status, text)
    assert snapshot(rv) == before
    await still_serves(session, rv)


@pytest.mark.parametrize("epoch", ["9" * 5000, "²", "１２"],
                         ids=["5000-digits", "superscript", "full-width"])
async def test_a_signed_epoch_header_that_is_no_number(
        session: aiohttp.ClientSession, rv: RoundsServer, epoch: str) -> None:
    path = protocol.PATH_KV_PREFIX + "num_keys"
    body = json.dumps({"worker": "tester"}).encode()
    headers = {**signed("POST", path, body), protocol.HEADER_EPOCH: epoch}
    status, text = await send(session, rv, "POST", path, body, headers)
    assert 400 <= status < 500, (status, text)
    await still_serves(session, rv)
