"""Fail-slow: a worker made 5x slower mid-run is named (log, event) and, with
--stragglers evict, taken out at a commit while the others keep their processes and the job
gets its speed back; a one-off pause and a job-wide slowdown name nobody. Real workers, 4
of them on two loopback hosts, each step's "device time" a sleep the test stretches through
control files (scripts/paced_control.py)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from tests.integration.harness import PYTHON
from tests.integration.watched import Watched, watch

SCRIPTS = Path(__file__).resolve().parent / "scripts"
HOSTS = ["-H", "localhost:2,127.0.0.1:2"]
STEP = re.compile(r"step (\d+) rank (\d+) size (\d+) host (\S+) pid (\d+) t=([\d.]+)")


class PacedJob:
    def __init__(self, tmp_path: Path, script: str, *flags: str) -> None:
        self.control = tmp_path / "control"
        self.control.mkdir()
        self.events = tmp_path / "events.jsonl"
        self.job: Watched = watch([*HOSTS, "--event-log", str(self.events), *flags, PYTHON,
                                   str(SCRIPTS / script), "--control", str(self.control)])

    def steps(self) -> list[tuple[int, int, int, str, int, float]]:
        """(step, rank, size, host, pid, time) of every step line so far."""
        return [(int(m[1]), int(m[2]), int(m[3]), m[4], int(m[5]), float(m[6]))
                for line in list(self.job.lines) if (m := STEP.search(line))]

    def worker_on(self, host: str) -> int:
        self.job.wait_for(r"step 10 rank 0 ")
        return max(pid for _, _, _, on, pid, _ in self.steps() if on == host)

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        if not self.events.exists():
            return []
        records = [json.loads(line) for line in self.events.read_text().splitlines() if line]
        return [{**r["data"], "time": r["time"]} for r in records if r["type"] == kind]

    def wait_event(self, kind: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not (found := self.events_of(kind)):
            assert time.monotonic() < deadline, f"no {kind} event in {timeout:g}s:\n" \
                                                f"{self.job.stderr[-3000:]}"
            assert self.job.proc.poll() is None, self.job.stderr[-3000:]
            time.sleep(0.2)
        return found[0]

    def rate(self, start: float, end: float, size: int | None = None) -> float:
        """Steps a second rank 0 made between the two times (at world `size`)."""
        times = [t for _, rank, n, _, _, t in self.steps()
                 if rank == 0 and start <= t <= end and size in (None, n)]
        assert len(times) >= 3, (start, end, size, self.job.stderr[-2000:])
        return (len(times) - 1) / (times[-1] - times[0])

    def slow(self, name: str, factor: float) -> float:
        (self.control / name).write_text(str(factor))
        return time.time()

    def stop(self) -> int:
        (self.control / "stop").touch()
        return self.job.finish()

    def __enter__(self) -> PacedJob:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None:  # (a failed wait: nothing of the job is left either)
            self.job.finish()


def test_a_slow_worker_is_evicted_at_a_commit_and_the_job_speeds_up(tmp_path: Path) -> None:
    flags = ("-np", "4", "--min-np", "2", "--stragglers", "evict",
             "--blacklist-cooldown-range", "600", "600")
    with PacedJob(tmp_path, "paced_train.py", *flags) as paced:
        victim = paced.worker_on("127.0.0.1")
        others = {pid for *_, pid, _ in paced.steps()} - {victim}
        slowed = paced.slow(f"slow-{victim}", 5)
        event = paced.wait_event("straggler", timeout=60)
        assert (event["host"], event["action"]) == ("127.0.0.1", "evicted"), event
        assert event["slowdown"] >= 3 and event["projected_gain"] >= 2, event
        print(f"named {event['time'] - slowed:.1f}s after the slowdown: {event}")
        paced.job.wait_for(r"step \d+ rank 0 size 3 ", timeout=90 - (time.time() - slowed))
        evicted = time.time()
        time.sleep(6)
        before_stop = time.time()
        code = paced.stop()
    assert code == 0, paced.job.stderr[-3000:]
    assert "this worker leaves the job (no place in the new round)" in paced.job.stderr
    after = {pid for _, _, size, _, pid, _ in paced.steps() if size == 3}
    assert after == others  # the others kept their processes; the straggler is gone
    while_slow, since = paced.rate(slowed + 1, evicted, 4), paced.rate(evicted, before_stop, 3)
    print(f"steps/s while slowed {while_slow:.2f}, after the eviction {since:.2f}")
    assert since >= 2 * while_slow


def test_a_torchrun_style_straggler_is_named_and_kept_at_min_np(tmp_path: Path) -> None:
    """An unmodified DDP script: its reducer's timings name the slow worker; --min-np at its
    default (-np 4) keeps it in, and the event says why."""
    with PacedJob(tmp_path, "paced_ddp.py", "-np", "4", "--stragglers", "evict") as paced:
        victim = paced.worker_on("127.0.0.1")
        paced.slow(f"slow-{victim}", 5)
        event = paced.wait_event("straggler", timeout=60)
        time.sleep(2)
        code = paced.stop()
    assert code == 0, paced.job.stderr[-3000:]
    assert (event["host"], event["action"]) == ("127.0.0.1", "kept"), event
    assert event["reason"] == "without it the job would have fewer than --min-np 4 slots"
    assert re.search(r"rank \d on host 127\.0\.0\.1 is a straggler: [\d.]+x slower than its "
                     r"peers.*not evicted", paced.job.stderr)
    assert {size for _, _, size, *_ in paced.steps()} == {4}


def test_a_pause_and_a_job_wide_slowdown_name_nobody(tmp_path: Path) -> None:
    with PacedJob(tmp_path, "paced_train.py", "-np", "4") as paced:
        paced.slow(f"pause-{paced.worker_on('127.0.0.1')}", 4)  # one worker pauses 4 s once
        time.sleep(8)
        paced.slow("slow-all", 3)  # then every worker is 3x slower, for 10 s (the window)
        time.sleep(10)
        (paced.control / "slow-all").unlink()
        time.sleep(1)
        code = paced.stop()
    assert code == 0, paced.job.stderr[-3000:]
    assert paced.events_of("straggler") == [] and "straggler" not in paced.job.stderr
    assert {size for _, _, size, *_ in paced.steps()} == {4}
    assert len({pid for *_, pid, _ in paced.steps()}) == 4  # nobody left, nobody replaced
