"""No 5xx for any input, on every worker route: a property over arbitrary JSON bodies.

Each example starts a real `WorkerServer` on 127.0.0.1 in front of a real round machine
(tests/rounds_server.py) with a round open, a timeline being written and a function job's
payload set, so a well-signed body reaches every handler's parsing and the machine behind
it. Its body is a valid request of the route with some fields (nested ones included)
replaced by arbitrary JSON: huge integers, NaN and infinities (as JSON's tokens and as
strings), deep nesting, any Unicode (lone surrogates included). Signed with the job secret,
the answer is 2xx or 4xx; not signed with it, it is 4xx and the job is unchanged.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from elasticrun import protocol
from tests.worker_routes import (
    KV,
    SECRET,
    VALID,
    forged,
    job,
    post,
    snapshot,
    still_serves,
    worker_routes,
)

pytestmark = pytest.mark.timeout(60)

POLL_S = 0.2  # every long-poll's bound in these tests (protocol.MAX_POLL_S is 30 s)


def test_every_worker_route_has_a_valid_request() -> None:
    assert set(VALID) == worker_routes()


def places(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every field of `value`, nested ones included (and the whole: ())."""
    found = [at]
    if isinstance(value, dict):
        for name, child in value.items():
            found += places(child, (*at, name))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += places(child, (*at, index))
    return found


def replaced(value: Any, at: tuple[Any, ...], new: Any) -> Any:
    if not at:
        return new
    value = copy.deepcopy(value)
    parent = value
    for step in at[:-1]:
        parent = parent[step]
    parent[at[-1]] = new
    return value


def deep(depth: int) -> str:
    """A stand-in for a value nested `depth` deep, put in by `encoded` (json.dumps itself
    would fail on it, or not, depending on how deep its caller's stack is)."""
    return f"@@deep {depth}@@"


def encoded(body: Any) -> bytes:
    text = json.dumps(body)
    for depth in {int(n) for n in re.findall(r'"@@deep (\d+)@@"', text)}:
        text = text.replace(f'"@@deep {depth}@@"', '{"a": [' * depth + "1" + "]}" * depth)
    return text.encode()


# --- strategies ----------------------------------------------------------------------------
huge_ints = st.sampled_from([10**400, -(10**400), 2**53, 2**53 + 1, 2**63, -(2**63) - 1,
                             2**64, 10**4299, -1])
special_strings = st.sampled_from(["NaN", "Infinity", "-Infinity", "inf", "1e400", "", "0",
                                   "\ud800", "\x00", "../../etc/passwd", "a" * 5000])
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), huge_ints,
    st.floats(),  # NaN and the infinities too: json.dumps writes them as NaN, Infinity
    st.text(max_size=30), st.text(st.characters(categories=["Cs"]), max_size=3),
    special_strings,
)
json_values = st.one_of(
    st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                 | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=10),
    st.integers(1, 2000).map(deep),
)


def like(value: Any) -> st.SearchStrategy[Any]:
    """Values of the kind of `value`, over the whole range of that kind (a JSON number is
    an integer or a float, whichever the field's usual value is)."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, (int, float)):
        return huge_ints | st.floats() | st.integers(-3, 3) | st.integers()
    if isinstance(value, str):
        return st.text(max_size=30) | special_strings
    return json_values


@st.composite
def bodies(draw: st.DrawFn, path: str) -> bytes:
    """A body for `path`: mostly its valid request with up to three fields replaced (or
    added) by values of their type or by any JSON; sometimes any JSON value."""
    if draw(st.integers(0, 9)) == 0:
        return encoded(draw(json_values))
    body: Any = VALID[path]
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(places(body)))
        old = at_value(body, where)
        if draw(st.booleans()) and isinstance(old, dict):
            where = (*where, draw(st.text(max_size=8)))  # a field it does not expect
        body = replaced(body, where, draw(like(old)) if draw(st.integers(0, 3)) else
                        draw(json_values))
    return encoded(body)


def at_value(value: Any, at: tuple[Any, ...]) -> Any:
    for step in at:
        value = value[step]
    return value


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, bytes]:
    path = draw(st.sampled_from(sorted(VALID)))
    return path, draw(bodies(path))


# How a request that is not the job's is signed: not at all, with another secret, or with
# the job's secret over another body.
FORGERIES = ("unsigned", "other secret", "other body")


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


@pytest.fixture
def short_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every long-poll (a held join, a notice poll, a store wait) ends within POLL_S."""
    monkeypatch.setattr(protocol, "MAX_POLL_S", POLL_S)


# --- the property ---------------------------------------------------------------------------
@settings(max_examples=400, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(request=requests(), forgery=st.sampled_from((None, None, None, *FORGERIES)))
async def test_no_route_answers_5xx_and_forged_requests_change_nothing(
        session: aiohttp.ClientSession, short_polls: None, tmp_path: Path,
        request: tuple[str, bytes], forgery: str | None) -> None:
    path, body = request
    async with job(tmp_path / "trace.json") as rv:
        before = snapshot(rv)
        headers = protocol.sign_headers(SECRET, "POST", path, body) if forgery is None \
            else forged(forgery, path, body)
        status, text = await post(session, rv.port, path, body, headers)
        event(f"{path} {'signed' if forgery is None else 'forged'}: {status}")
        if forgery is None:
            assert 200 <= status < 500, (path, body[:300], status, text[:300])
        else:
            assert 400 <= status < 500, (path, forgery, status, text[:300])
            assert snapshot(rv) == before
        await still_serves(session, rv)


# --- the known 500s, named -------------------------------------------------------------------
HUGE = 10**400
LIVENESS = {"after": 0, "round": 1, "timeout": 0, "worker_id": "w1", "probe_ack": 1}
KNOWN = {
    "notices timeout": (protocol.PATH_NOTICES, {"after": 1000000000, "timeout": HUGE}),
    "stalled waited_s, unknown worker": (protocol.PATH_STALLED,
                                         {"worker_id": "x", "round": 1, "waited_s": HUGE}),
    "stalled waited_s": (protocol.PATH_STALLED,
                         {"worker_id": "w0", "round": 1, "waited_s": -HUGE}),
    "timeline ts": (protocol.PATH_TIMELINE,
                    {"worker_id": "w0", "events": [["X", "n", "c", HUGE, 1, 0, {}]]}),
    "timeline dur": (protocol.PATH_TIMELINE,
                     {"worker_id": "w0", "events": [["X", "n", "c", 1, HUGE, 0, {}]]}),
    "liveness since_s": (protocol.PATH_NOTICES, {**LIVENESS, "liveness": {"since_s": HUGE}}),
    "liveness cpu_s": (protocol.PATH_NOTICES, {**LIVENESS, "liveness": {"cpu_s": -HUGE}}),
    "kv get timeout": (KV + "get", {"worker": "tester", "key": "k", "timeout": HUGE}),
    "kv wait timeout": (KV + "wait", {"worker": "tester", "keys": ["k"], "timeout": -HUGE}),
    "kv multi_get timeout": (KV + "multi_get",
                             {"worker": "tester", "keys": ["k"], "timeout": HUGE}),
    "timeline open, no timeline yet": (protocol.PATH_TIMELINE,
                                       {"worker_id": "w0", "open": "\ud800"}),
}


@pytest.mark.parametrize("name", sorted(KNOWN))
async def test_the_requests_that_answered_500_get_400(
        session: aiohttp.ClientSession, short_polls: None, tmp_path: Path, name: str) -> None:
    path, payload = KNOWN[name]
    body = json.dumps(payload).encode()
    trace = None if "open" in payload else tmp_path / "trace.json"
    async with job(trace) as rv:
        before = snapshot(rv)
        status, text = await post(session, rv.port, path, body,
                                  protocol.sign_headers(SECRET, "POST", path, body))
        assert status == 400, text
        assert "error" in json.loads(text)
        assert snapshot(rv) == before
        await still_serves(session, rv)
