"""Unit tests for elasticrun.driver.operate.sinks: signing, webhook delivery, JSON-lines file, bus.

Webhook tests run a real aiohttp receiver on 127.0.0.1; nothing in aiohttp is mocked.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from multidict import CIMultiDict

from elasticrun.driver.operate.sinks import (
    EVENT_TYPES,
    HEADER_EVENT,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    Event,
    EventBus,
    JsonLinesSink,
    redact_url,
    sign_event,
    verify_event,
)
from elasticrun.driver.operate.webhook_sink import WebhookSink

KEY = b"0123456789abcdef-webhook-key"
FAST = (0.01, 0.02)  # backoff for tests


class Receiver:
    """Records every POST; answers with the queued statuses, then 200; can hold requests."""

    def __init__(self) -> None:
        self.requests: list[tuple[CIMultiDict[str], bytes, str]] = []
        self.statuses: list[int] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.arrived = asyncio.Event()
        self.port = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests.append((request.headers.copy(), body, request.path_qs))
        self.arrived.set()
        await self.gate.wait()
        return web.Response(status=self.statuses.pop(0) if self.statuses else 200)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def seqs(self) -> list[int]:
        return [json.loads(body)["seq"] for _, body, _ in self.requests]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver()
    app = web.Application()
    app.router.add_post("/hook", rec.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    rec.port = runner.addresses[0][1]
    yield rec
    rec.gate.set()  # let held handlers finish so the server stops promptly
    await runner.cleanup()


@pytest.fixture
def dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


@pytest.fixture
def events_log(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> pytest.LogCaptureFixture:
    monkeypatch.setattr(logging.getLogger("elasticrun"), "propagate", True)
    caplog.set_level(logging.DEBUG, logger="elasticrun.events")
    return caplog


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "elasticrun.events" and r.levelno >= logging.WARNING]


async def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def make_event(seq: int = 1, **data: Any) -> Event:
    return Event(seq=seq, type="host_added", time=1700000000.5, job_id="job-1", data=data)


# --------------------------------------------------------------------------- Event / signing


def test_event_to_json_is_compact_and_sorted() -> None:
    event = Event(seq=3, type="job_started", time=1.5, job_id="j", data={"b": 1, "a": [1, 2]})
    assert event.to_json() == (
        b'{"data":{"a":[1,2],"b":1},"job_id":"j","seq":3,"time":1.5,"type":"job_started"}'
    )


def test_sign_event_format() -> None:
    sig = sign_event(KEY, "1700000000", b"{}")
    assert sig.startswith("sha256=") and len(sig) == len("sha256=") + 64
    assert sig != sign_event(KEY, "1700000001", b"{}")


def test_verify_event_accepts_valid_and_rejects_tampering() -> None:
    body = make_event(host="a").to_json()
    ts = "1700000000"
    headers = {HEADER_TIMESTAMP: ts, HEADER_SIGNATURE: sign_event(KEY, ts, body)}
    now = 1700000010.0
    assert verify_event(KEY, headers, body, now)
    # Header names are case-insensitive, even in a plain dict.
    assert verify_event(KEY, {k.lower(): v for k, v in headers.items()}, body, now)
    assert not verify_event(KEY, headers, body + b" ", now)
    assert not verify_event(KEY, headers, body.replace(b'"a"', b'"b"'), now)
    assert not verify_event(KEY, {**headers, HEADER_TIMESTAMP: "1700000001"}, body, now)
    assert not verify_event(b"another key", headers, body, now)
    # Stale or from the future: outside the window either way.
    assert not verify_event(KEY, headers, body, 1700000000.0 + 301)
    assert not verify_event(KEY, headers, body, 1700000000.0 - 301)
    assert verify_event(KEY, headers, body, 1700000000.0 + 301, window_s=600)


@pytest.mark.parametrize("headers", [
    {},
    {HEADER_TIMESTAMP: "1700000000"},
    {HEADER_SIGNATURE: "sha256=00"},
    {HEADER_TIMESTAMP: "", HEADER_SIGNATURE: "x"},
    {HEADER_TIMESTAMP: "soon", HEADER_SIGNATURE: "sha256=00"},
    {HEADER_TIMESTAMP: "nan", HEADER_SIGNATURE: "sha256=00"},
    {HEADER_TIMESTAMP: "1700000000", HEADER_SIGNATURE: "sha256=\u00e9\u00e9"},
])
def test_verify_event_rejects_missing_or_malformed_headers(headers: dict[str, str]) -> None:
    assert not verify_event(KEY, headers, b"{}", 1700000000.0)


def test_verify_event_needs_the_prefix() -> None:
    ts = "1700000000"
    bare = sign_event(KEY, ts, b"{}").removeprefix("sha256=")
    assert not verify_event(KEY, {HEADER_TIMESTAMP: ts, HEADER_SIGNATURE: bare}, b"{}", 1.7e9)


def test_redact_url() -> None:
    assert redact_url("https://u:pw@Example.com:8443/a/b?token=x#f") == \
        "https://example.com:8443/a/..."
    assert redact_url("https://hooks.example.com/services/T0/B0/secret") == \
        "https://hooks.example.com/services/..."
    assert redact_url("http://[::1]:9000/hook?k=v") == "http://[::1]:9000/hook"
    assert redact_url("http://host/hook") == "http://host/hook"
    assert redact_url("http://host:notaport/x") == "<invalid url>"


# --------------------------------------------------------------------------- EventBus


class ListSink:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.closed_with: float | None = None

    def publish(self, event: Event) -> None:
        self.events.append(event)

    async def close(self, timeout: float) -> None:
        self.closed_with = timeout


class BrokenSink:
    def publish(self, event: Event) -> None:
        raise RuntimeError("broken sink")

    async def close(self, timeout: float) -> None:
        raise RuntimeError("broken close")


async def test_bus_assigns_increasing_seq_and_rejects_unknown_types() -> None:
    first, second = ListSink(), ListSink()
    bus = EventBus("job-7", [first, BrokenSink(), second])
    before = time.time()
    a = bus.emit("job_started", np=4)
    with pytest.raises(ValueError, match="no_such_event"):
        bus.emit("no_such_event")
    b = bus.emit("host_added", host="h1", type="not the event type")
    c = bus.emit("job_finished")
    assert [e.seq for e in (a, b, c)] == [1, 2, 3]
    assert [e.type for e in (a, b, c)] == ["job_started", "host_added", "job_finished"]
    assert a.job_id == "job-7" and a.data == {"np": 4}
    assert b.data == {"host": "h1", "type": "not the event type"}
    assert before <= a.time <= b.time <= c.time <= time.time()
    assert first.events == second.events == [a, b, c]  # a broken sink harms no other
    await bus.close(1.5)
    assert first.closed_with == second.closed_with == 1.5


def test_every_event_type_is_accepted() -> None:
    bus = EventBus("j", [])
    assert [bus.emit(t).type for t in EVENT_TYPES] == list(EVENT_TYPES)


# --------------------------------------------------------------------------- JsonLinesSink


async def test_json_lines_appends_one_line_per_event(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"seq":0}\n')
    bus = EventBus("j", [JsonLinesSink(path)])
    sent = [bus.emit("job_started"), bus.emit("host_added", host="h", slots=2),
            bus.emit("job_finished", ok=True)]
    assert len(path.read_text().splitlines()) == 4  # flushed per line, before close
    await bus.close()
    bus = EventBus("j", [JsonLinesSink(path)])
    sent.append(bus.emit("job_started"))
    await bus.close()
    lines = path.read_bytes().splitlines()
    assert lines[0] == b'{"seq":0}'
    assert lines[1:] == [e.to_json() for e in sent]
    assert [json.loads(line)["seq"] for line in lines] == [0, 1, 2, 3, 1]
    assert json.loads(lines[2])["data"] == {"host": "h", "slots": 2}


async def test_json_lines_unwritable_path_warns_once(
    tmp_path: Path, events_log: pytest.LogCaptureFixture
) -> None:
    bus = EventBus("j", [JsonLinesSink(tmp_path)])  # a directory
    for _ in range(3):
        bus.emit("host_added")
    await bus.close()
    assert len(warnings_of(events_log)) == 1


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
async def test_json_lines_write_error_warns_once(events_log: pytest.LogCaptureFixture) -> None:
    bus = EventBus("j", [JsonLinesSink(Path("/dev/full"))])
    for _ in range(3):
        bus.emit("host_added")
    await bus.close()
    assert len(warnings_of(events_log)) == 1


# --------------------------------------------------------------------------- WebhookSink


async def test_webhook_delivers_every_event_in_order_signed(receiver: Receiver) -> None:
    sink = WebhookSink(receiver.url, KEY)
    bus = EventBus("job-42", [sink])
    sent = [bus.emit(t, n=i) for i, t in enumerate(EVENT_TYPES)]
    await bus.close(5.0)  # a healthy sink drains its queue on close
    assert (sink.delivered, sink.dropped, sink.pending) == (len(sent), 0, 0)
    assert receiver.seqs() == list(range(1, len(sent) + 1))
    for event, (headers, body, path) in zip(sent, receiver.requests, strict=True):
        assert path == "/hook"
        assert headers["Content-Type"] == "application/json"
        assert headers[HEADER_EVENT] == event.type
        assert verify_event(KEY, headers, body, time.time())
        assert not verify_event(b"wrong key", headers, body, time.time())
        assert not verify_event(KEY, headers, body, float(headers[HEADER_TIMESTAMP]) + 301)
        assert body == event.to_json()
        doc = json.loads(body)
        assert doc == {"seq": event.seq, "type": event.type, "time": event.time,
                       "job_id": "job-42", "data": {"n": event.data["n"]}}


@pytest.mark.parametrize("statuses", [[500, 500], [429, 503]])
async def test_webhook_retries_5xx_and_429(receiver: Receiver, statuses: list[int]) -> None:
    receiver.statuses = list(statuses)
    sink = WebhookSink(receiver.url, KEY, backoff=FAST)
    sink.publish(make_event(host="a"))
    await wait_until(lambda: sink.delivered == 1)
    await sink.close(5.0)
    assert (sink.delivered, sink.dropped, sink.pending) == (1, 0, 0)
    assert len(receiver.requests) == 3
    assert {body for _, body, _ in receiver.requests} == {make_event(host="a").to_json()}
    assert all(verify_event(KEY, h, b, time.time()) for h, b, _ in receiver.requests)


async def test_webhook_gives_up_after_max_attempts(
    receiver: Receiver, events_log: pytest.LogCaptureFixture
) -> None:
    receiver.statuses = [500] * 3
    sink = WebhookSink(receiver.url, KEY, max_attempts=3, backoff=FAST)
    sink.publish(make_event(1))
    await wait_until(lambda: sink.dropped == 1)
    sink.publish(make_event(2))
    await wait_until(lambda: sink.delivered == 1)
    await sink.close(5.0)
    assert len(receiver.requests) == 4
    assert receiver.seqs() == [1, 1, 1, 2]
    assert (sink.delivered, sink.dropped, sink.pending) == (1, 1, 0)
    assert warnings_of(events_log)


async def test_webhook_does_not_retry_4xx(
    receiver: Receiver, events_log: pytest.LogCaptureFixture
) -> None:
    receiver.statuses = [400]
    sink = WebhookSink(receiver.url, KEY, backoff=FAST)
    sink.publish(make_event(1))
    await wait_until(lambda: sink.dropped == 1)
    sink.publish(make_event(2))
    await sink.close(5.0)  # a 4xx comes from a live receiver: close still drains the queue
    assert receiver.seqs() == [1, 2]  # one attempt each
    assert (sink.delivered, sink.dropped, sink.pending) == (1, 1, 0)
    assert any("HTTP 400" in line for line in warnings_of(events_log))


async def test_webhook_warnings_are_rate_limited(
    receiver: Receiver, events_log: pytest.LogCaptureFixture
) -> None:
    receiver.statuses = [400] * 10
    sink = WebhookSink(receiver.url, KEY, backoff=FAST)
    for seq in range(1, 4):
        sink.publish(make_event(seq))
    await wait_until(lambda: sink.dropped == 3)
    assert len(warnings_of(events_log)) == 1  # the first failure only
    assert sink._last_log is not None
    sink._last_log -= 31  # as if the 30 s interval had passed
    sink.publish(make_event(4))
    await wait_until(lambda: sink.dropped == 4)
    lines = warnings_of(events_log)
    assert len(lines) == 2 and "4 event(s) dropped" in lines[-1] and "HTTP 400" in lines[-1]
    await sink.close(1.0)
    await sink.close(1.0)  # idempotent: one summary at close, not two
    assert len(warnings_of(events_log)) == 3


def test_webhook_publish_before_the_loop_runs(dead_url: str) -> None:
    sink = WebhookSink(dead_url, KEY)
    sink.publish(make_event(1))  # no running loop: queued, no exception
    assert (sink.pending, sink.dropped) == (1, 0)
    start = time.perf_counter()
    asyncio.run(sink.close(1.0))  # starts delivery, sees the receiver down, stops
    assert time.perf_counter() - start < 1.5
    assert (sink.delivered, sink.dropped, sink.pending) == (0, 1, 0)


async def test_webhook_receiver_down_never_blocks(
    dead_url: str, events_log: pytest.LogCaptureFixture
) -> None:
    sink = WebhookSink(dead_url, KEY)  # default backoff: retries would take seconds
    bus = EventBus("j", [sink])
    start = time.perf_counter()
    for _ in range(100):
        bus.emit("host_added", host="h")
    assert time.perf_counter() - start < 0.05
    assert (sink.delivered, sink.dropped, sink.pending) == (0, 0, 100)
    start = time.perf_counter()
    await bus.close(1.0)
    assert time.perf_counter() - start < 1.5
    assert (sink.delivered, sink.dropped, sink.pending) == (0, 100, 0)
    # Rate-limited: the first failure, then the summary at close; not one line per event.
    lines = warnings_of(events_log)
    assert 1 <= len(lines) <= 3
    assert "100" in lines[-1]
    sink.publish(make_event())  # after close: dropped, still no exception
    assert sink.dropped == 101


async def test_webhook_close_is_bounded_when_receiver_hangs(receiver: Receiver) -> None:
    receiver.gate.clear()  # the handler never answers while the test runs
    sink = WebhookSink(receiver.url, KEY, timeout=30.0)
    sink.publish(make_event(1))
    sink.publish(make_event(2))
    await asyncio.wait_for(receiver.arrived.wait(), 5.0)
    start = time.perf_counter()
    await sink.close(0.5)
    elapsed = time.perf_counter() - start
    assert 0.4 <= elapsed < 1.5  # healthy so far: waits for the drain, but only so long
    assert (sink.delivered, sink.dropped, sink.pending) == (0, 2, 0)


async def test_webhook_request_timeout_is_retried_then_dropped(
    receiver: Receiver, events_log: pytest.LogCaptureFixture
) -> None:
    receiver.gate.clear()
    sink = WebhookSink(receiver.url, KEY, timeout=0.2, max_attempts=2, backoff=FAST)
    sink.publish(make_event(1))
    await wait_until(lambda: sink.dropped == 1)
    assert receiver.seqs() == [1, 1]
    assert any("no response within 0.2 s" in line for line in warnings_of(events_log))
    await sink.close(1.0)


async def test_webhook_cancelled_close_still_stops_delivery(receiver: Receiver) -> None:
    receiver.gate.clear()
    sink = WebhookSink(receiver.url, KEY)
    sink.publish(make_event(1))
    await asyncio.wait_for(receiver.arrived.wait(), 5.0)
    closing = asyncio.ensure_future(sink.close(30.0))
    await asyncio.sleep(0.05)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert (sink.dropped, sink.pending) == (1, 0)
    assert sink._task is not None
    await wait_until(sink._task.done, timeout=2.0)


async def test_webhook_close_does_not_wait_while_failing(receiver: Receiver) -> None:
    receiver.statuses = [500] * 100
    sink = WebhookSink(receiver.url, KEY, backoff=(5.0, 5.0))
    sink.publish(make_event(1))
    await wait_until(lambda: len(receiver.requests) == 1)
    await asyncio.sleep(0.05)  # the 500 is back; the sink now sits in its 5 s backoff
    start = time.perf_counter()
    await sink.close(10.0)
    assert time.perf_counter() - start < 1.5
    assert (sink.delivered, sink.dropped, sink.pending) == (0, 1, 0)


async def test_webhook_queue_overflow_drops_oldest(receiver: Receiver) -> None:
    receiver.gate.clear()
    sink = WebhookSink(receiver.url, KEY, queue_size=3)
    sink.publish(make_event(1))
    await asyncio.wait_for(receiver.arrived.wait(), 5.0)  # event 1 is in flight, held
    for seq in range(2, 11):
        sink.publish(make_event(seq))
    assert (sink.dropped, sink.pending) == (6, 4)
    receiver.gate.set()
    await sink.close(5.0)
    assert receiver.seqs() == [1, 8, 9, 10]
    assert (sink.delivered, sink.dropped, sink.pending) == (4, 6, 0)


async def test_webhook_logs_never_show_url_secrets(
    receiver: Receiver, dead_url: str, events_log: pytest.LogCaptureFixture
) -> None:
    receiver.statuses = [400, 500, 500]
    secret_url = f"http://alice:pw-s3cret@127.0.0.1:{receiver.port}/hook?token=abc"
    dead_secret = dead_url.replace("http://", "http://alice:pw-s3cret@") + "?token=abc"
    sinks = [WebhookSink(secret_url, KEY, max_attempts=2, queue_size=1, backoff=FAST),
             WebhookSink(dead_secret, KEY, max_attempts=2, queue_size=1, backoff=FAST)]
    bus = EventBus("j", sinks)
    for _ in range(4):  # with queue_size=1, overflow drops are logged too
        bus.emit("host_added")
    await wait_until(lambda: sinks[0].pending == 0 and sinks[1].dropped > 0)
    await bus.close(1.0)
    assert receiver.requests[0][2] == "/hook?token=abc"  # the query does reach the receiver
    assert receiver.requests[0][0]["Authorization"].startswith("Basic ")
    text = "\n".join(r.getMessage() for r in events_log.records)
    assert f"http://127.0.0.1:{receiver.port}/hook" in text
    assert dead_url in text
    for secret in ("pw-s3cret", "alice", "token", "abc"):
        assert secret not in text
