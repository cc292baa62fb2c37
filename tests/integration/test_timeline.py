"""The Timeline end to end: real workers, real Gloo, the real driver writing the trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.integration.harness import PYTHON, SCRIPTS, JobResult, run_job

TRAIN = [PYTHON, str(SCRIPTS / "elastic_train.py")]
SCRIPT = [PYTHON, str(SCRIPTS / "timeline_script.py")]
COMMON = ["--start-timeout", "60"]

Event = dict[str, Any]


def assert_ok(result: JobResult) -> None:
    assert result.returncode == 0, f"job failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def load(path: Path) -> list[Event]:
    text = path.read_text()
    assert text.rstrip().endswith("]"), "the driver did not close the trace"
    events = json.loads(text)
    assert isinstance(events, list) and events
    for event in events:  # what every trace viewer needs
        assert {"name", "ph", "pid", "tid"} <= event.keys(), event
        if event["ph"] != "M":
            assert isinstance(event["ts"], (int, float)) and event["cat"], event
    return events


def assert_nested(events: list[Event]) -> None:
    """On every thread of every lane, complete events nest (as the viewers need)."""
    threads: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in events:
        if e["ph"] == "X":
            threads.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for thread, spans in threads.items():
        open_ends: list[float] = []
        for start, end in sorted(spans, key=lambda span: (span[0], -span[1])):
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], f"{thread}: overlap at {start}"
            open_ends.append(end)


def lanes(events: list[Event]) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}


def named(events: list[Event], pid: int, name: str) -> list[Event]:
    return sorted((e for e in events if e["pid"] == pid and e["name"] == name),
                  key=lambda e: e["ts"])


def test_flag_trace_shows_every_lane_and_a_recovery_in_order(tmp_path: Path) -> None:
    """Two workers on two hosts with --timeline-filename; the one on 127.0.0.1 is SIGKILLed
    at step 13 (after its events of several steps went out: they leave every 0.5 s), the
    other goes on alone (--min-np 1) until the killed one's new worker joins it."""
    trace = tmp_path / "timeline.json"
    result = run_job(["-H", "localhost:1,127.0.0.1:1", "--min-np", "1",
                      "--timeline-filename", str(trace), "--timeline-mark-cycles",
                      *COMMON, *TRAIN],
                     {"TRAIN_SAMPLES": "64", "TRAIN_EPOCHS": "2", "TRAIN_BATCH": "4",
                      "TRAIN_STEP_SLEEP": "0.1", "FAULTS": "13:1:sigkill"},
                     log_dir=tmp_path / "logs")
    assert_ok(result)
    events = load(trace)
    assert_nested(events)
    names = lanes(events)
    assert names[1].startswith("driver · ") and len(names) in (3, 4)  # 4: the new worker
    survivor = next(pid for pid, name in names.items()
                    if name.startswith("rank 0 · localhost · worker w"))
    killed = next(pid for pid, name in names.items()
                  if name.startswith("rank 1 · 127.0.0.1 · worker w"))
    for pid in (survivor, killed):
        mine = [e for e in events if e["pid"] == pid and e["ph"] != "M"]
        assert {"collective", "fusion", "elastic", "round"} <= {e["cat"] for e in mine}
        assert any(e["cat"] == "collective" and e["args"].get("bytes", 0) > 0 for e in mine)
        assert len(named(events, pid, "commit")) >= 3
        assert all(e["ph"] == "X" for e in named(events, pid, "commit"))
        assert named(events, pid, "build group") and named(events, pid, "sync")
        assert named(events, pid, "CYCLE")
    # The driver: round 1 formed with 2, the failure, round 2 opened and formed with 1.
    assert named(events, 1, "round 1 formed")[0]["args"] == {"round": 1, "size": 2}
    assert named(events, 1, "round 1 rendezvous")[0]["ph"] == "X"
    failed = named(events, 1, "worker failed")
    assert len(failed) == 1 and failed[0]["args"]["kind"] == "signal"
    assert failed[0]["args"]["host"] == "127.0.0.1" and failed[0]["args"]["rank"] == 1
    opened = named(events, 1, "round 2 opened")[0]
    formed = named(events, 1, "round 2 formed")[0]
    assert failed[0]["ts"] <= opened["ts"] <= formed["ts"]
    assert formed["args"] == {"round": 2, "size": 1}
    assert named(events, 1, "job finished")
    # The survivor: the failed collective, restore, reset (rejoining round 2), sync.
    lost = named(events, survivor, "WorkersFailedError")
    restore = named(events, survivor, "restore")
    reset = named(events, survivor, "reset")[:1]  # (a second: the new worker joining)
    rejoin = [e for e in named(events, survivor, "rendezvous") if e["args"]["round"] == 2]
    assert len(lost) == len(restore) == len(reset) == len(rejoin) == 1
    assert lost[0]["ts"] <= restore[0]["ts"] <= reset[0]["ts"] <= rejoin[0]["ts"]
    assert rejoin[0]["ts"] + rejoin[0]["dur"] >= opened["ts"]  # placed once round 2 opened
    assert named(events, survivor, "sync")[-1]["ts"] >= reset[0]["ts"] + reset[0]["dur"]


def test_start_timeline_from_the_script(tmp_path: Path) -> None:
    """With Horovod's HOROVOD_TIMELINE=DYNAMIC: nothing is recorded until the script calls
    start_timeline (and no file named DYNAMIC appears)."""
    trace = tmp_path / "from_script.json"
    result = run_job(["-np", "2", *COMMON, *SCRIPT],
                     {"TIMELINE_PATH": str(trace), "OUT_DIR": str(tmp_path),
                      "HOROVOD_TIMELINE": "DYNAMIC"}, cwd=tmp_path)
    assert_ok(result)
    assert not (tmp_path / "DYNAMIC").exists()
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["on_at_init"] is False and seen["on_after_stop"] is False
        assert "already being written to" in seen["other_path"] and str(trace) in \
            seen["other_path"]
    events = load(trace)
    assert len([pid for pid in lanes(events) if pid != 1]) == 2
    assert len([e for e in events if e["name"] == "commit"]) >= 8
    assert not (tmp_path / "from_script.json.other.json").exists()


def test_no_timeline_writes_nothing_and_sends_nothing(tmp_path: Path) -> None:
    result = run_job(["-np", "2", "--log-level", "DEBUG", *COMMON, *SCRIPT],
                     {"OUT_DIR": str(tmp_path)}, cwd=tmp_path)
    assert_ok(result)
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["on_at_init"] is False and "other_path" not in seen
    assert "timeline" not in result.stderr.lower()  # the driver logs each timeline request
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.json", "rank1.json"]
