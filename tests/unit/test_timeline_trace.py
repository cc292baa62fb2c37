"""The Timeline's parts without worker processes: the trace file and its events, the
driver's timeline (lanes, its own events), the worker's recorder, and the two talking over
the real signed endpoint."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elasticrun import protocol
from elasticrun.driver.operate.timeline import (
    DRIVER_PID,
    JobTimeline,
    TimelineConflict,
    short_id,
)
from elasticrun.driver.operate.trace_file import TraceFile, complete, from_worker, instant
from elasticrun.driver.processes.records import new_worker_id
from elasticrun.driver.rounds import events as ev
from elasticrun.driver.rounds.assignment import assign
from elasticrun.driver.rounds.machine import RoundMachine
from elasticrun.driver.server.app import WorkerServer
from elasticrun.job.config import DriverConfig
from elasticrun.job.errors import ConfigError
from elasticrun.protocol import HostUpdateResult
from elasticrun.worker import timeline
from elasticrun.worker.client import DriverClient, RequestRefusedError
from elasticrun.worker.timeline_tracks import MAX_THREADS, Tracks

NOW = 1_800_000_000.0


@pytest.fixture(autouse=True)
def _fresh_recorder() -> Iterator[None]:
    yield
    timeline.detach(timeout=1.0)
    timeline._events.clear()


# --- the trace file -----------------------------------------------------------------------
def test_trace_file_is_a_json_array_once_closed(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    trace = TraceFile(path)
    trace.write([instant(1, 2, "a", "elastic", NOW, {})])
    trace.write([])
    trace.write([complete(1, 1, "b", "round", NOW, NOW + 0.5, {"size": 2}),
                 instant(1, 2, "c", "elastic", NOW + 1, {})])
    # Before the close (a killed driver): everything but the closing bracket is there.
    assert json.loads(path.read_text() + "]")[1]["dur"] == 500_000.0
    trace.close()
    trace.close()
    events = json.loads(path.read_text())
    assert [e["name"] for e in events] == ["a", "b", "c"]
    assert events[0]["ts"] == NOW * 1e6 and trace.written == 3


def test_an_empty_trace_is_valid(tmp_path: Path) -> None:
    trace = TraceFile(tmp_path / "t.json")
    trace.close()
    assert json.loads((tmp_path / "t.json").read_text()) == []


def test_worker_events_become_trace_events() -> None:
    x = from_worker(["X", "allreduce", "collective", 10.0, 2.5, 2, {"bytes": 8}], pid=4)
    assert x == {"name": "allreduce", "cat": "collective", "ph": "X", "ts": 10.0, "dur": 2.5,
                 "pid": 4, "tid": 2, "args": {"bytes": 8}}
    i = from_worker(["i", "CYCLE", "collective", 10, 0, 2, {}], pid=4)
    assert i["ph"] == "i" and i["s"] == "t" and "dur" not in i
    m = from_worker(["M", "thread_name", "__metadata", 0, 0, 3, {"name": "x"}], pid=4)
    assert m == {"name": "thread_name", "ph": "M", "pid": 4, "tid": 3, "args": {"name": "x"}}


@pytest.mark.parametrize("raw", [
    "X", ["X", "a", "c", 1, 1, 1], ["B", "a", "c", 1, 1, 1, {}], ["X", 5, "c", 1, 1, 1, {}],
    ["X", "a", "c", float("nan"), 1, 1, {}], ["X", "a", "c", 1, -1, 1, {}],
    ["X", "a", "c", True, 1, 1, {}], ["X", "a", "c", 1, 1, True, {}],
    ["X", "a", "c", 1, 1, 10**6, {}], ["X", "a", "c", 1, 1, 1, []],
    ["M", "process_name", "__metadata", 0, 0, 0, {"name": "not yours"}],
])
def test_malformed_worker_events_are_refused_in_one_line(raw: Any) -> None:
    with pytest.raises(ValueError) as info:
        from_worker(raw, pid=2)
    assert str(info.value) and "\n" not in str(info.value)


# --- the driver's timeline ----------------------------------------------------------------
def read(path: Path) -> list[dict[str, Any]]:
    text = path.read_text()
    return json.loads(text if text.rstrip().endswith("]") else text + "]")


def test_driver_lane_rounds_failures_and_host_changes(tmp_path: Path) -> None:
    clock = iter([NOW, NOW + 1, NOW + 2, NOW + 3, NOW + 4, NOW + 5, NOW + 6])
    job = JobTimeline(tmp_path / "t.json", clock=lambda: next(clock), host="node0")
    job.start()
    assignment = assign([("a", 2)])
    job.action(ev.OpenRound(1, assignment, 2))
    job.action(ev.Report("round_completed", {"number": 1}))
    job.action(ev.RecordFailure("a/1/2-x", "a", "rank 1 on host a was killed by SIGKILL",
                                "signal", 1, -9))
    job.action(ev.Report("hosts_changed", {"old": {"a": 2}, "new": {"a": 2, "b": 1}}))
    job.action(ev.PostNotice(1, HostUpdateResult.added))
    job.action(ev.SetTimer(ev.Timer(ev.TimerKind.CUT_ROUND), NOW))  # not worth a mark
    job.action(ev.Finish(0))
    job.close()
    events = json.loads((tmp_path / "t.json").read_text())
    assert all(e["pid"] == DRIVER_PID for e in events)
    assert {e["args"]["name"] for e in events if e["name"] == "process_name"} == \
        {"driver · node0"}
    marks = [(e["name"], e["ts"] / 1e6 - NOW) for e in events if e["ph"] != "M"]
    assert marks == [("round 1 opened", 0), ("round 1 rendezvous", 0), ("round 1 formed", 1),
                     ("worker failed", 2), ("hosts changed", 3), ("notice: hosts added", 4),
                     ("job finished", 6)]  # the timer took a tick, unmarked
    rendezvous = next(e for e in events if e["name"] == "round 1 rendezvous")
    assert rendezvous["dur"] == 1e6 and rendezvous["args"] == {"round": 1, "size": 2}
    failed = next(e for e in events if e["name"] == "worker failed")
    assert failed["args"]["rank"] == 1 and failed["args"]["exit_code"] == -9
    changed = next(e for e in events if e["name"] == "hosts changed")
    assert changed["args"] == {"added": "b:1", "removed": ""}


def test_driver_lane_marks_a_straggler_and_its_end(tmp_path: Path) -> None:
    clock = iter([NOW, NOW + 9])
    job = JobTimeline(tmp_path / "t.json", clock=lambda: next(clock), host="node0")
    job.start()
    job.action(ev.Report("straggler", {"rank": 3, "host": "b", "slowdown": 4.9,
                                       "action": "evicted", "reason": "4x faster",
                                       "projected_gain": 3.7}))
    job.action(ev.Report("straggler_cleared", {"rank": 3, "host": "b", "slowdown": 1.0}))
    job.close()
    events = [e for e in json.loads((tmp_path / "t.json").read_text()) if e["ph"] != "M"]
    assert [(e["name"], e["ts"] / 1e6 - NOW) for e in events] == [
        ("straggler: rank 3 (evicted)", 0), ("straggler cleared: rank 3", 9)]
    assert events[0]["args"] == {"host": "b", "slowdown": 4.9, "reason": "4x faster"}


def test_driver_events_before_a_worker_opens_the_file_are_kept(tmp_path: Path) -> None:
    job = JobTimeline(clock=lambda: NOW, host="h")
    job.start()  # no --timeline-filename: nothing opened, nothing written
    job.action(ev.OpenRound(1, assign([("a", 1)]), 1))
    assert not job.recording and job.worker_env() == {}
    assert job.add("w", 0, "a", [["i", "x", "elastic", 1, 0, 1, {}]]) == 0
    path = tmp_path / "late.json"
    job.open(str(path))
    job.open(str(path))  # the same path: nothing happens
    with pytest.raises(TimelineConflict, match="already being written to"):
        job.open(str(tmp_path / "other.json"))
    job.close()
    assert [e["name"] for e in read(path) if e["ph"] != "M"] == ["round 1 opened"]


def test_worker_lanes_are_named_by_rank_host_and_worker(tmp_path: Path) -> None:
    job = JobTimeline(tmp_path / "t.json", host="h", clock=lambda: NOW)
    job.start()
    event = ["X", "allreduce", "collective", 1.0, 1.0, 2, {"bytes": 4}]
    assert job.add("node1/0/7-ab12cd34", -1, "node1", [event]) == 1  # rank not known yet
    assert job.add("node1/0/7-ab12cd34", 3, "node1", [event], dropped=5) == 1
    assert job.add("node1/1/8-ffffffff", 0, "node1", [event]) == 1
    with pytest.raises(ValueError):
        job.add("node1/1/8-ffffffff", 0, "node1", [event, ["X"]])
    job.close()
    events = read(tmp_path / "t.json")
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {1: "driver · h", 2: "rank 3 · node1 · worker w7",
                     3: "rank 0 · node1 · worker w8"}
    order = {e["pid"]: e["args"]["sort_index"] for e in events
             if e["name"] == "process_sort_index"}
    assert order[1] < order[3] < order[2]
    assert [e["args"] for e in events if e["name"] == "5 events lost"] == [{"dropped": 5}]
    assert len([e for e in events if e["name"] == "allreduce"]) == 3  # not the bad batch


def test_flag_file_that_cannot_be_written_is_one_config_error(tmp_path: Path) -> None:
    job = JobTimeline(tmp_path / "missing" / "t.json", mark_cycles=True)
    with pytest.raises(ConfigError, match="--timeline-filename .*cannot write") as info:
        job.start()
    assert "\n" not in str(info.value)
    assert job.worker_env() == {protocol.ENV_TIMELINE: "1",
                                protocol.ENV_TIMELINE_MARK_CYCLES: "1"}


def test_mark_cycles_needs_a_timeline_file() -> None:
    with pytest.raises(ConfigError, match="--timeline-mark-cycles needs --timeline-filename"):
        DriverConfig(command=("x",), np=1, min_np=1, max_np=1, timeline_mark_cycles=True)


def test_short_worker_ids() -> None:
    assert short_id("127.0.0.1/0/12-deadbeef") == "w12"
    assert short_id("custom") == "custom"


# --- the worker's recorder ----------------------------------------------------------------
class FakeClient:
    def __init__(self, refuse: str = "", recording: bool = True) -> None:
        self.calls: list[dict[str, Any]] = []
        self.refuse = refuse
        self.recording = recording

    def call(self, path: str, payload: dict[str, Any], wait: float = 0.0) -> dict[str, Any]:
        assert path == protocol.PATH_TIMELINE
        if self.refuse and "open" in payload:
            raise RequestRefusedError(409, self.refuse)
        self.calls.append(payload)
        return {"recording": self.recording, "written": len(payload["events"])}

    def events(self) -> list[list[Any]]:
        return [e for call in self.calls for e in call["events"]]


def attach(client: FakeClient, env: dict[str, str] | None = None) -> None:
    timeline.attach(client, "node/0/3-x", lambda: (0, "node"),  # type: ignore[arg-type]
                    env=env if env is not None else {})


def test_off_by_default_and_nothing_is_kept() -> None:
    client = FakeClient()
    attach(client)
    assert not timeline.enabled()
    timeline.record("allreduce", "collective", 1.0, 2.0, bytes=4)
    timeline.instant("x", "elastic")
    timeline.mark_cycle()
    with timeline.span("commit", "elastic"):
        pass
    timeline.detach()
    assert not timeline._events and client.calls == []


def test_recorded_events_reach_the_driver_with_their_threads() -> None:
    client = FakeClient()
    attach(client, {protocol.ENV_TIMELINE: "1", protocol.ENV_TIMELINE_MARK_CYCLES: "1"})
    assert timeline.enabled()
    timeline.record("allreduce", "collective", 10.0, 10.5, bytes=1024, op="sum")
    timeline.record("grouped allreduce", "fusion", 10.0, 11.0, bucket=1, tensors=3,
                    obj=object(), inf=float("inf"))
    timeline.mark_cycle()
    with pytest.raises(KeyError), timeline.span("commit", "elastic", commit=1):
        raise KeyError("x")
    timeline.detach()
    assert client.calls and all(c["rank"] == 0 and c["host"] == "node" for c in client.calls)
    events = client.events()
    named = {e[5]: e[6]["name"] for e in events if e[1] == "thread_name"}
    assert named == {2: "collectives", 4: "fusion", 1: "elastic and rounds"}
    real = [e for e in events if e[0] != "M"]
    assert real[0] == ["X", "allreduce", "collective", 10_000_000.0, 500_000.0, 2,
                       {"bytes": 1024, "op": "sum"}]
    assert real[1][5] == 4 and real[1][6]["inf"] == "inf" and real[1][6]["obj"].startswith("<")
    assert real[2][:3] == ["i", "CYCLE", "collective"]
    assert real[3][1] == "commit" and real[3][6] == {"commit": 1, "error": "KeyError"}
    json.dumps(client.calls)  # what goes to the driver is JSON


def test_start_asks_the_driver_to_open_the_path(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    client = FakeClient()
    attach(client)
    timeline.start_timeline("trace.json")
    assert client.calls[0]["open"] == str(tmp_path / "trace.json")
    assert timeline.enabled()
    timeline.stop_timeline()
    assert not timeline.enabled()


def test_a_refused_path_is_a_value_error_and_env_start_only_warns(
        caplog: pytest.LogCaptureFixture) -> None:
    client = FakeClient(refuse="the job's timeline is already being written to /a.json")
    attach(client, {"HOROVOD_TIMELINE": "/b.json"})  # refused: a warning, training goes on
    assert not timeline.enabled() and "was not started" in caplog.text
    with pytest.raises(ValueError, match="already being written to /a.json"):
        timeline.start_timeline("/b.json")


def test_start_needs_init_and_a_driver(caplog: pytest.LogCaptureFixture) -> None:
    timeline.detach()
    with pytest.raises(ValueError, match="init"):
        timeline.start_timeline("t.json")
    timeline.attach(None, "", lambda: (0, ""), env={protocol.ENV_TIMELINE: "1"})
    timeline.start_timeline("t.json")
    assert not timeline.enabled() and "no driver" in caplog.text


def test_a_driver_without_a_file_turns_recording_off() -> None:
    client = FakeClient(recording=False)
    attach(client, {protocol.ENV_TIMELINE: "1"})
    timeline.instant("x", "elastic")
    timeline._recorder._wake.set()  # type: ignore[union-attr]
    deadline = time.monotonic() + 5
    while timeline.enabled() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not timeline.enabled()


def test_events_that_overlap_without_nesting_go_to_the_next_thread() -> None:
    tracks = Tracks()  # events come as they end
    assert tracks.place(2, 2, 5) == 0
    assert tracks.place(2, 0, 10) == 0  # holds the one before
    assert tracks.place(2, 10, 20) == 0  # after it
    assert tracks.place(2, 21, 30) == 0  # three buckets in flight at once
    assert tracks.place(2, 22, 35) == 1
    assert tracks.place(2, 23, 36) == 2
    assert tracks.place(2, 24, 25) == 0  # ended out of order, inside the first bucket
    assert tracks.place(2, 40, 41) == 0
    assert tracks.place(2, 20, 50) == 0  # holds everything since
    assert tracks.place(1, 22, 35) == 0  # categories are apart
    crowd = [tracks.place(3, i, 1000 + i) for i in range(MAX_THREADS + 5)]
    assert crowd == [*range(MAX_THREADS), *[MAX_THREADS - 1] * 5]


def test_buckets_in_flight_at_once_are_drawn_on_threads_of_their_own() -> None:
    client = FakeClient()
    attach(client, {protocol.ENV_TIMELINE: "1"})
    timeline.record("allreduce a", "collective", 1.0, 3.0)
    timeline.record("allreduce b", "collective", 2.0, 4.0)
    timeline.record("step", "collective", 0.5, 5.0)  # holds both
    timeline.detach()
    events = client.events()
    assert [(e[1], e[5]) for e in events if e[0] == "X"] == \
        [("allreduce a", 2), ("allreduce b", 12), ("step", 2)]
    assert {e[5]: e[6]["name"] for e in events if e[1] == "thread_name"} == \
        {2: "collectives", 12: "collectives (2)"}


@pytest.mark.parametrize(("env", "expected"), [
    ({}, (False, None, False)),
    ({protocol.ENV_TIMELINE: "1"}, (True, None, False)),
    ({protocol.ENV_TIMELINE: "1", protocol.ENV_TIMELINE_MARK_CYCLES: "1",
      "HOROVOD_TIMELINE": "/x.json"}, (True, None, True)),
    ({"HOROVOD_TIMELINE": "/x.json"}, (True, "/x.json", False)),
    ({"HOROVOD_TIMELINE": "/x.json", "HOROVOD_TIMELINE_MARK_CYCLES": "1"},
     (True, "/x.json", True)),
    ({"HOROVOD_TIMELINE": "DYNAMIC"}, (False, None, False)),
])
def test_settings_from_env(env: dict[str, str], expected: tuple[bool, str | None, bool]) -> None:
    assert timeline.settings_from_env(env) == expected


def test_collective_boundary_records_bytes_and_op() -> None:
    from elasticrun.torch.world.boundary import collective

    client = FakeClient()
    attach(client)
    with collective("allreduce", nbytes=64, op="sum"):
        pass  # off: nothing
    timeline.start()
    with collective("allreduce", nbytes=64, op="sum"):
        pass
    timeline.detach()
    real = [e for e in client.events() if e[0] != "M"]
    assert [(e[1], e[2], e[6]) for e in real] == [("allreduce", "collective",
                                                   {"bytes": 64, "op": "sum"})]


# --- worker and driver over the real signed endpoint --------------------------------------
async def test_recorder_and_driver_over_signed_http(tmp_path: Path) -> None:
    config = DriverConfig(command=("x",), np=1, min_np=1, max_np=1)
    job = JobTimeline(host="h")
    secret = protocol.new_secret()
    server = WorkerServer(secret, RoundMachine(config, new_worker_id).state,
                          lambda event: None, job)
    port = await server.start("127.0.0.1")
    client = DriverClient("127.0.0.1", port, secret, unreachable_timeout=5)
    path = tmp_path / "trace.json"

    def worker() -> None:
        timeline.attach(client, "node/0/5-x", lambda: (1, "node"), env={})
        timeline.start_timeline(str(path))
        timeline.start_timeline(str(path))
        with pytest.raises(ValueError, match="409"):
            timeline.start_timeline(str(tmp_path / "other.json"))
        timeline.record("allreduce", "collective", NOW, NOW + 0.001, bytes=8)
        timeline.detach()
        with pytest.raises(RequestRefusedError) as info:
            client.call(protocol.PATH_TIMELINE, {"worker_id": "w", "events": [["X"]]})
        assert info.value.status == 400

    try:
        await asyncio.to_thread(worker)
    finally:
        client.close()
        await server.stop()
        job.close()
    events = json.loads(path.read_text())
    assert [e["args"]["name"] for e in events if e["name"] == "process_name"] == \
        ["driver · h", "rank 1 · node · worker w5"]
    assert [e["args"] for e in events if e["name"] == "allreduce"] == [{"bytes": 8}]
