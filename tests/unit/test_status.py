"""Unit tests for the job status (elasticrun.driver.operate.status) and `elasticrun status`
(elasticrun.cli.status): host states, the /status JSON, its table, and fetching it over HTTP."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from aiohttp import web

from elasticrun.cli.entry import main
from elasticrun.cli.status import fetch_status, format_status
from elasticrun.driver.hosts.registry import BlacklistEntry
from elasticrun.driver.operate.flash_cadence import CadenceReport, FlashCadences
from elasticrun.driver.operate.status import JobView, build_status, count_states, host_states
from elasticrun.driver.rounds.assignment import assign
from elasticrun.job.errors import ElasticrunError

NOW = 500.0
WALL = 1_700_000_000.0


def view() -> JobView:
    """One host in each state.

    a, b: in the round and discovered (active); gone: in the round, no longer discovered
    (leaving); c: standby for the next round (starting); d: drained but in the round
    (draining); e: drained, not in the round (drained); f: blacklisted for good; g: in the
    round and blacklisted with a cooldown; x: an expired cooldown (idle); h: over max-np (idle).
    """
    return JobView(
        job_id="job-1", state="running", now=NOW, wall_now=WALL, started_at=WALL - 3725.5,
        round=3, round_complete=True,
        assignment=assign([("a", 2), ("b", 1), ("gone", 1), ("d", 2), ("g", 1)]),
        standby_hosts=frozenset({"c"}),
        discovered={"a": 2, "b": 1, "c": 1, "d": 2, "e": 1, "f": 1, "g": 1, "x": 1, "h": 4},
        drained=frozenset({"d", "e"}),
        blacklist={
            "f": BlacklistEntry(failures=3, until=None),
            "g": BlacklistEntry(failures=1, until=NOW + 30.25),
            "x": BlacklistEntry(failures=2, until=NOW),  # ended exactly now
            "old": BlacklistEntry(failures=1, until=NOW - 1),  # ended, not discovered
        },
        slot_blacklist={
            ("a", 1): BlacklistEntry(failures=1, until=NOW + 12.5),
            ("h", 3): BlacklistEntry(failures=2, until=None),
            ("b", 0): BlacklistEntry(failures=1, until=NOW),  # ended exactly now
        },
        np=4, min_np=2, max_np=7, reset_limit=10,
        discovery="host-change webhook", discovery_error=None,
    )


EXPECTED_STATES = {
    "a": "active", "b": "active", "c": "starting", "d": "draining", "e": "drained",
    "f": "blacklisted", "g": "blacklisted", "x": "idle", "h": "idle", "gone": "leaving",
}


def test_host_states_one_of_each_in_order() -> None:
    states = host_states(view())
    assert list(states.items()) == list(EXPECTED_STATES.items())


def test_host_states_undiscovered_round_hosts_sorted_after_discovered() -> None:
    v = replace(view(), assignment=assign([("zz", 1), ("a", 1), ("mm", 1)]),
                discovered={"a": 1}, drained=frozenset(), blacklist={},
                standby_hosts=frozenset())
    assert list(host_states(v).items()) == [("a", "active"), ("mm", "leaving"),
                                            ("zz", "leaving")]


def test_host_states_drained_standby_and_blacklisted_leaving() -> None:
    v = replace(view(), assignment=assign([("gone", 1)]), discovered={"c": 1},
                standby_hosts=frozenset({"c"}), drained=frozenset({"c"}),
                blacklist={"gone": BlacklistEntry(1, None)})
    assert host_states(v) == {"c": "drained", "gone": "blacklisted"}


def test_count_states() -> None:
    assert count_states(EXPECTED_STATES) == {
        "active": 2, "starting": 1, "draining": 1, "drained": 1, "blacklisted": 2,
        "idle": 2, "leaving": 1,
    }
    assert count_states({}) == {}


def test_build_status() -> None:
    status = build_status(view())
    assert status == {
        "job_id": "job-1",
        "driver_epoch": 1,
        "state": "running",
        "uptime_s": 3725.5,
        "round": 3,
        "round_complete": True,
        "world_size": 7,
        "resets": 2,
        "reset_limit": 10,
        "restarts": 0,
        "last_restore": None,
        "flash_commits": None,
        "stragglers": None,
        "np": 4, "min_np": 2, "max_np": 7,
        "hosts": [
            {"host": "a", "slots": 2, "state": "active", "ranks": [0, 1]},
            {"host": "b", "slots": 1, "state": "active", "ranks": [2]},
            {"host": "c", "slots": 1, "state": "starting", "ranks": []},
            {"host": "d", "slots": 2, "state": "draining", "ranks": [4, 5]},
            {"host": "e", "slots": 1, "state": "drained", "ranks": []},
            {"host": "f", "slots": 1, "state": "blacklisted", "ranks": []},
            {"host": "g", "slots": 1, "state": "blacklisted", "ranks": [6]},
            {"host": "x", "slots": 1, "state": "idle", "ranks": []},
            {"host": "h", "slots": 4, "state": "idle", "ranks": []},
            {"host": "gone", "slots": 0, "state": "leaving", "ranks": [3]},
        ],
        "blacklist": [
            {"host": "f", "failures": 3, "cooldown_left_s": None, "cooldown_ends_at": None},
            {"host": "g", "failures": 1, "cooldown_left_s": 30.25,
             "cooldown_ends_at": WALL + 30.25},
        ],
        "blacklisted_slots": [
            {"host": "a", "slot": 1, "failures": 1, "cooldown_left_s": 12.5,
             "cooldown_ends_at": WALL + 12.5},
            {"host": "h", "slot": 3, "failures": 2, "cooldown_left_s": None,
             "cooldown_ends_at": None},
        ],
        "discovery": {"source": "host-change webhook", "last_error": None},
    }
    json.dumps(status)  # serialisable as it is


def test_build_status_after_a_total_loss_says_what_was_restored() -> None:
    restore = {"round": 4, "commit": 12, "source": "host a"}
    status = build_status(replace(view(), restarts=1, last_restore=restore))
    assert (status["restarts"], status["last_restore"]) == (1, restore)
    json.dumps(status)


def test_status_shows_the_flash_commits_cadence_of_its_live_workers() -> None:
    cadences = FlashCadences()
    assert cadences.summary({"w1"}) is None
    cadences.report("w1", CadenceReport(every=1, copy_s=0.001, step_s=0.1, commits=40,
                                        skipped=0))
    cadences.report("w2", CadenceReport(every=3, copy_s=0.006, step_s=0.1, commits=12,
                                        skipped=1))
    cadences.report("gone", CadenceReport(every=9, copy_s=0.5, step_s=0.1, commits=1,
                                          skipped=0))
    flash = cadences.summary({"w1", "w2"})  # the sparsest cadence of the live workers
    assert flash == {"every_steps": 3, "copy_ms": 6.0, "step_ms": 100.0, "cost": 0.0196,
                     "workers": 2, "commits": 52, "skipped": 1}
    status = build_status(replace(view(), flash_commits=flash))
    assert format_status(status).splitlines()[-1] == (
        "flash commits: every 3 steps (a commit 6.0 ms, step 100.0 ms, 1.96% of the time), "
        "52 written by 2 worker(s)")
    assert cadences.summary({"w1"}) == {"every_steps": 1, "copy_ms": 1.0, "step_ms": 100.0,
                                        "cost": 0.0099, "workers": 1, "commits": 40,
                                        "skipped": 0}


def test_status_names_the_stragglers_or_the_slowest_member() -> None:
    members = [{"rank": 0, "host": "a", "slowdown": 0.98, "straggler": False},
               {"rank": 1, "host": "b", "slowdown": 1.07, "straggler": False}]
    status = build_status(replace(view(), stragglers={"mode": "report", "members": members}))
    assert status["stragglers"]["members"] == members
    assert format_status(status).splitlines()[-1] == (
        "stragglers: none (slowest: rank 1 at 1.07x its peers' pace) (--stragglers report)")
    members[0].update(slowdown=4.9, straggler=True)
    status = build_status(replace(view(), stragglers={"mode": "evict", "members": members}))
    assert format_status(status).splitlines()[-1] == (
        "stragglers: rank 0 on a (4.9x its peers' pace) (--stragglers evict)")
    quiet = build_status(replace(view(), stragglers={"mode": "report", "members": []}))
    assert "stragglers" not in format_status(quiet)  # (before the round's first tick)
    json.dumps(status)


def test_build_status_before_the_first_round() -> None:
    v = replace(view(), state="starting", round=0, round_complete=False, assignment={},
                standby_hosts=frozenset(), discovered={}, drained=frozenset(), blacklist={},
                max_np=None, reset_limit=None, discovery_error="script exited with code 1")
    status = build_status(v)
    assert (status["round"], status["resets"], status["world_size"]) == (0, 0, 0)
    assert status["hosts"] == [] and status["blacklist"] == []
    assert status["max_np"] is None and status["reset_limit"] is None
    assert status["discovery"]["last_error"] == "script exited with code 1"


# --------------------------------------------------------------------------- format_status


def test_format_status_table() -> None:
    assert format_status(build_status(view())) == "\n".join([
        "job job-1: running, round 3, world size 7, resets 2/10, up 1h02m05s",
        "hosts from host-change webhook",
        "HOST  SLOTS  STATE        RANKS",
        "a     2      active       0,1",
        "b     1      active       2",
        "c     1      starting     -",
        "d     2      draining     4,5",
        "e     1      drained      -",
        "f     1      blacklisted  -",
        "g     1      blacklisted  6",
        "x     1      idle         -",
        "h     4      idle         -",
        "gone  0      leaving      3",
        "blacklisted:",
        "  f  3 failure(s), permanently",
        "  g  1 failure(s), for another 30s",
        "blacklisted slots:",
        "  a[1]  1 time(s), for another 12s",
        "  h[3]  2 time(s), permanently",
    ])


def test_format_status_rank_ranges_no_limit_and_discovery_error() -> None:
    status = {
        "job_id": "j", "state": "recovering", "round": 1, "world_size": 6, "resets": 0,
        "reset_limit": None, "uptime_s": 65.9,
        "discovery": {"source": "hostfile h", "last_error": "hostfile h: not UTF-8 text"},
        "hosts": [{"host": "n1", "slots": 3, "state": "active", "ranks": [0, 1, 2]},
                  {"host": "n2", "slots": 3, "state": "active", "ranks": [3, 5, 6]}],
        "blacklist": [],
    }
    assert format_status(status) == "\n".join([
        "job j: recovering, round 1, world size 6, resets 0, up 1m05s",
        "hosts from hostfile h (last poll failed: hostfile h: not UTF-8 text)",
        "HOST  SLOTS  STATE   RANKS",
        "n1    3      active  0-2",
        "n2    3      active  3,5,6",
    ])


def test_format_status_names_a_resumed_drivers_epoch() -> None:
    status = build_status(replace(view(), epoch=3))
    assert status["driver_epoch"] == 3
    assert format_status(status).splitlines()[0] == (
        "job job-1: running, round 3, world size 7, resets 2/10, up 1h02m05s, driver epoch 3 "
        "(resumed)")


def test_format_status_tolerates_missing_fields() -> None:
    assert format_status({"hosts": []}) == "\n".join([
        "job None: None, round None, world size None, resets None, up ?",
        "hosts from None",
        "HOST  SLOTS  STATE  RANKS",
    ])


# --------------------------------------------------------------------------- fetch_status


async def _serve(handler: Any) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/status", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def fetch(url: str) -> dict[str, Any]:
    # fetch_status blocks (urllib): run it off the loop that serves the answer.
    return await asyncio.to_thread(fetch_status, url, 5.0)


async def fetch_error(url: str) -> str:
    with pytest.raises(ElasticrunError) as info:
        await fetch(url)
    message = str(info.value)
    assert message and "\n" not in message
    return message


async def test_fetch_status_good_json() -> None:
    status = build_status(view())

    async def handler(request: web.Request) -> web.Response:
        return web.json_response(status)

    async for address in _serve(handler):
        assert await fetch(address) == status
        assert await fetch(f"http://{address}/") == status
        assert await fetch(f"http://{address}/status") == status


async def test_fetch_status_not_json() -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text="<html>hello</html>")

    async for address in _serve(handler):
        assert await fetch_error(address) == (
            f"http://{address}/status: the answer is not JSON; is this an elasticrun driver?")


async def test_fetch_status_json_that_is_not_a_status() -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response([1, 2])

    async for address in _serve(handler):
        assert await fetch_error(address) == (
            f"http://{address}/status: the answer is not an elasticrun status")


async def test_fetch_status_http_500() -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=500, text="boom")

    async for address in _serve(handler):
        assert await fetch_error(address) == (
            f"http://{address}/status: the driver answered HTTP 500")


async def test_fetch_status_nothing_listening() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    message = await fetch_error(f"127.0.0.1:{port}")
    assert message.startswith(f"http://127.0.0.1:{port}/status: cannot reach the driver: ")
    assert "Connection refused" in message


# --------------------------------------------------------------------------- `elasticrun status`


@pytest.mark.parametrize("form", ["argument", "--url"])
async def test_the_status_command_takes_the_url_either_way(
        capsys: pytest.CaptureFixture[str], form: str) -> None:
    """`elasticrun status URL` and `elasticrun status --url URL` show the same table."""
    status = build_status(view())

    async def handler(request: web.Request) -> web.Response:
        return web.json_response(status)

    async for address in _serve(handler):
        url = f"http://{address}"
        args = ["status", url] if form == "argument" else ["status", "--url", url]
        await asyncio.to_thread(main, args)  # blocks (urllib): off the loop that answers
    out, err = capsys.readouterr()
    assert (out, err) == (format_status(status) + "\n", "")
