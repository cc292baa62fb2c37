"""Refusals caused by outsiders (elasticrun.system.outsiders), with a fake clock: each
is counted by kind, and each kind is logged at most once a minute, with the count and the
addresses since its last line, never a traceback."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp.http_exceptions import BadHttpMessage
from prometheus_client import CollectorRegistry

from elasticrun.system.outsiders import (
    KINDS,
    MAX_ADDRESSES,
    Outsiders,
    agent_kind,
    quiet_aiohttp,
    refusal_counter,
    signature_kind,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "elasticrun.refused"]


def test_the_first_refusal_is_logged_then_one_line_a_minute_with_the_count(
        clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    outsiders = Outsiders(clock=clock)
    with caplog.at_level(logging.INFO, logger="elasticrun.refused"):
        outsiders.refused("wrong_webhook_token", "127.0.0.1")
        assert lines(caplog) == [
            "refused a host-change webhook request from 127.0.0.1: missing or wrong bearer "
            "token; more are counted in elasticrun_refused_requests_total"
            "{kind=\"wrong_webhook_token\"} and logged at most every 60s"]
        for second in range(1, 200):  # one a second for 199 seconds
            clock.now = 1000.0 + second * 0.3
            outsiders.refused("wrong_webhook_token", f"10.0.0.{second % 4}")
        assert len(lines(caplog)) == 1  # 59.7 s: none is due yet
        clock.now = 1060.0
        outsiders.refused("wrong_webhook_token", "10.0.0.9")
        assert lines(caplog)[1] == ("refused 200 host-change webhook requests from 10.0.0.0 "
                                    "and 4 other addresses in the last 60s: missing or wrong "
                                    "bearer token")
        clock.now = 1061.0
        outsiders.refused("wrong_webhook_token", "10.0.0.9")
        clock.now = 1119.0
        outsiders.flush()
        assert lines(caplog)[2:] == ["refused 1 host-change webhook request from 10.0.0.9 in "
                                     "the last 59s: missing or wrong bearer token"]
        outsiders.flush()  # nothing held back: nothing written
        assert len(lines(caplog)) == 3
    assert outsiders.count("wrong_webhook_token") == 202
    assert all(r.exc_info is None and r.levelno == logging.WARNING for r in caplog.records)


async def test_on_a_loop_the_held_line_is_written_when_due_without_another_refusal(
        caplog: pytest.LogCaptureFixture) -> None:
    outsiders = Outsiders(every_s=0.2)
    with caplog.at_level(logging.INFO, logger="elasticrun.refused"):
        for _ in range(10):
            outsiders.refused("replayed", "127.0.0.1")
        assert len(lines(caplog)) == 1
        for _ in range(100):  # 5 s at most
            if len(lines(caplog)) > 1:
                break
            await asyncio.sleep(0.05)
    assert len(lines(caplog)) == 2
    assert lines(caplog)[1].startswith("refused 9 requests from 127.0.0.1 in the last ")
    assert lines(caplog)[1].endswith("s: replayed request")


def test_each_kind_has_its_own_minute(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    outsiders = Outsiders(clock=clock)
    with caplog.at_level(logging.INFO, logger="elasticrun.refused"):
        for _ in range(50):
            outsiders.refused("wrong_agent_token", "127.0.0.1")
            outsiders.refused("bad_signature", "127.0.0.1")
        clock.now += 30
        outsiders.refused("stale", "127.0.0.2")
    written = lines(caplog)
    assert len(written) == 3
    assert written[0].startswith("refused an agent connection from 127.0.0.1: bad signature "
                                 "(is its --token-file the job's agent token?)")
    assert written[1].startswith("refused a request from 127.0.0.1: bad signature;")
    assert written[2].startswith("refused a request from 127.0.0.2: stale request")
    assert (outsiders.count("wrong_agent_token"), outsiders.count("bad_signature"),
            outsiders.count("stale"), outsiders.count("replayed")) == (50, 50, 1, 0)


def test_the_counter_is_the_driver_metric_with_every_kind_from_zero(clock: Clock) -> None:
    registry = CollectorRegistry()
    outsiders = Outsiders(refusal_counter(registry), clock=clock)
    for _ in range(3):
        outsiders.refused("malformed_http", "127.0.0.1")

    def sample(kind: str) -> float | None:
        return registry.get_sample_value("elasticrun_refused_requests_total", {"kind": kind})

    assert sample("malformed_http") == 3
    assert all(sample(kind) == 0 for kind in KINDS if kind != "malformed_http")


def test_an_unknown_kind_is_a_programming_error(clock: Clock) -> None:
    """Labels come from the code, never from a request: the metric's series stay bounded."""
    with pytest.raises(ValueError, match="unknown kind"):
        Outsiders(clock=clock).refused("made up", "127.0.0.1")


def test_addresses_are_bounded_and_printed_safely(clock: Clock,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    outsiders = Outsiders(clock=clock)
    with caplog.at_level(logging.INFO, logger="elasticrun.refused"):
        outsiders.refused("unsigned", "\x1b[2J" + "x" * 200)
        for n in range(MAX_ADDRESSES * 3):
            outsiders.refused("unsigned", f"10.1.{n // 250}.{n % 250}")
        clock.now += 61
        outsiders.refused("unsigned", None)
    first, second = lines(caplog)
    assert "\x1b" not in first and "\\x1b[2J" in first and len(first) < 400
    assert f"refused {MAX_ADDRESSES * 3 + 1} requests from " in second
    assert f"and more than {MAX_ADDRESSES - 1} other addresses" in second


@pytest.mark.parametrize(("reason", "kind", "agent"), [
    ("unsigned request", "unsigned", "wrong_agent_token"),
    ("bad signature", "bad_signature", "wrong_agent_token"),
    ("malformed timestamp", "bad_signature", "wrong_agent_token"),
    ("stale request", "stale", "stale_agent"),
    ("replayed request", "replayed", "replayed_agent"),
])
def test_kinds_of_signature_refusals(reason: str, kind: str, agent: str) -> None:
    assert signature_kind(reason) == kind and agent_kind(reason) == agent
    assert kind in KINDS and agent in KINDS


def aiohttp_record(exc: BaseException) -> logging.LogRecord:
    return logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1,
                             "Error handling request from %s", ("127.0.0.1",),
                             (type(exc), exc, None))


def test_quiet_aiohttp_takes_malformed_requests_only_and_is_removed(clock: Clock) -> None:
    outsiders = Outsiders(clock=clock)
    logger = logging.getLogger("aiohttp.server")
    before = list(logger.filters)
    with quiet_aiohttp(outsiders):
        assert len(logger.filters) == len(before) + 1
        quiet = logger.filters[-1]
        assert not quiet.filter(aiohttp_record(BadHttpMessage("bad header")))  # type: ignore[union-attr]
        assert quiet.filter(aiohttp_record(RuntimeError("a bug of ours: keep its traceback")))  # type: ignore[union-attr]
    assert logger.filters == before
    assert outsiders.count("malformed_http") == 1
