"""What recording a timeline costs: the same elastic job with the timeline off and on.

2 workers on this machine train er_train.py's model with DistributedOptimizer and a
TorchState committed every step, so that every step records its most events (the gradient
buckets, their collectives, the commit and its agreement). Three measurements:

- jobs: er_train.py once without a timeline and once with `--timeline-filename`,
  interleaved, `trials` times. Step time is rank 0's, the median over windows of 10 steps
  after a warm-up; the overhead is on / off - 1. Separate jobs differ from each other by
  more than 2% on a shared machine, so this one needs many trials.
- blocks: one job (er_timeline_ab.py) whose workers switch the timeline off and on every
  BLOCK steps; the same processes, interleaved in time. Per block, the median step time
  without its first SKIP steps (where the switch and the sender's last flush fall); the
  overhead is the median over (off, on) pairs of blocks, the warm-up pair left out.
- costs: where the cost arises, measured in this process: what recording adds to a
  collective's boundary (the training thread), what the sender thread spends per event
  (encoding it, JSON) and what the driver spends per event (checking it, writing it; the
  driver shares this machine's cores, so half of it counts per worker), times the events
  a step records, as a share of the step time.

Target: at most 2% of the step time.
"""

from __future__ import annotations

import json
import sys
import tempfile
import timeit
from pathlib import Path
from typing import Any

from benchlib import (
    SCRIPTS,
    Jobs,
    bench_env,
    elasticrun_command,
    median,
    print_table,
    read_events,
)

WARMUP_STEPS = 5
WINDOW = 10
MODES = ("off", "on")
BLOCK, SKIP = 100, 10


def step_ms(out: Path) -> float:
    steps = [e for e in read_events(out) if e["event"] == "step" and e["rank"] == 0]
    times = [e["time"] for e in steps[WARMUP_STEPS:]]
    return median((times[i + WINDOW] - times[i]) / WINDOW * 1e3
                  for i in range(0, len(times) - WINDOW, WINDOW))


def run_job(mode: str, params: float, steps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "events.jsonl"
        trace = Path(tmp) / "timeline.json"
        env = bench_env({"BENCH_OUT": str(out), "BENCH_PARAMS": f"{params:g}",
                         "BENCH_STEPS": str(steps + WARMUP_STEPS), "BENCH_COMMIT_EVERY": "1"})
        flags = ["-np", "2"] + (["--timeline-filename", str(trace)] if mode == "on" else [])
        with Jobs() as jobs:
            jobs.start(elasticrun_command(flags, SCRIPTS / "er_train.py"), env)
            jobs.wait(900, f"timeline overhead job (timeline {mode})", progress=out)
        result = {"step_ms": step_ms(out)}
        if mode == "on":
            events = [e for e in json.loads(trace.read_text()) if e["ph"] != "M"]
            result["events"] = len(events)
            result["events_per_step"] = len([e for e in events if e["pid"] > 1]) / (
                2 * (steps + WARMUP_STEPS))
        return result


def run_blocks(params: float, blocks: int) -> dict[str, Any]:
    """One job switching the timeline every BLOCK steps: (off, on) step ms per pair."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "events.jsonl"
        trace = Path(tmp) / "timeline.json"
        env = bench_env({"BENCH_OUT": str(out), "BENCH_PARAMS": f"{params:g}",
                         "BENCH_STEPS": str(blocks * BLOCK), "BENCH_BLOCK": str(BLOCK),
                         "BENCH_TRACE": str(trace)})
        with Jobs() as jobs:
            jobs.start(elasticrun_command(["-np", "2", "--timeline-filename", str(trace)],
                                          SCRIPTS / "er_timeline_ab.py"), env)
            jobs.wait(900, "timeline on/off job", progress=out)
        steps = [e for e in read_events(out) if e["event"] == "step" and e["rank"] == 0]
    per_block: list[float] = []
    for block in range(blocks):
        times = [e["time"] for e in steps if (e["step"] - 1) // BLOCK == block]
        kept = times[SKIP:]
        per_block.append(median(b - a for a, b in zip(kept, kept[1:], strict=False)) * 1e3)
    assert all(e["timeline"] == ((e["step"] - 1) // BLOCK % 2 == 1) for e in steps)
    pairs = [(per_block[i], per_block[i + 1]) for i in range(2, blocks - 1, 2)]
    return {"pairs_ms": pairs,
            "overhead_percent": median((on / off - 1) * 100 for off, on in pairs)}


def event_costs(events: int = 20_000) -> dict[str, float]:
    """Microseconds: a collective's boundary with the timeline off and on (the training
    thread's share, with the sender running beside it), and the sender's work per event:
    encoding it, then JSON as the client sends it."""
    sys.path.insert(0, str(SCRIPTS.parents[1]))
    from elasticrun.driver.operate.timeline import JobTimeline
    from elasticrun.torch.world.boundary import collective
    from elasticrun.worker import timeline

    class Client:  # the driver, as far as the sender can tell
        def call(self, path: str, payload: dict[str, Any], wait: float = 0.0) -> dict[str, Any]:
            json.dumps(payload).encode()
            return {"recording": True}

    def boundary() -> float:
        best = min(timeit.repeat(
            'with collective("grouped allreduce", nbytes=4096, op="average"): pass',
            globals={"collective": collective}, number=events, repeat=5))
        return best / events * 1e6

    timeline.attach(Client(), "bench", lambda: (0, "localhost"), env={})  # type: ignore[arg-type]
    off = boundary()
    timeline.start()
    on = boundary()
    timeline.detach()
    sample = [("X", "grouped allreduce", "fusion", 1.0, 1.0,
               {"bucket": 0, "tensors": 3, "bytes": 4096, "queue_ms": 0.1, "run_ms": 1.2}),
              ("X", "commit", "elastic", 1.0, 1.0, {"commit": 7}),
              ("X", "grouped allreduce", "collective", 1.0, 1.0, {"bytes": 4096, "op": ""})]
    recorder = timeline._Recorder(None, "bench", lambda: (0, "localhost"))
    batch = sample * 300  # about what a worker sends every 0.5 s

    def send() -> None:
        json.dumps({"events": [item for event in batch
                               for item in recorder._encode(event)]}).encode()

    rounds = max(1, events // len(batch))
    sender = min(timeit.repeat(send, number=rounds, repeat=5)) / rounds / len(batch) * 1e6
    body = json.dumps({"events": [item for event in batch
                                  for item in recorder._encode(event)]}).encode()
    with tempfile.TemporaryDirectory() as tmp:
        job = JobTimeline(Path(tmp) / "timeline.json", host="localhost")
        job.start()

        def take() -> None:  # what the driver's endpoint does with a batch
            job.add("bench", 0, "localhost", json.loads(body)["events"])

        driver = min(timeit.repeat(take, number=rounds, repeat=5)) / rounds / len(batch) * 1e6
        job.close()
    return {"boundary_off_us": off, "boundary_on_us": on, "sender_us_per_event": sender,
            "driver_us_per_event": driver}


def bench(trials: int, quick: bool) -> dict[str, Any]:
    params, steps, blocks = (1e5, 21, 4) if quick else (1e6, 300, 20)
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    ab: list[dict[str, Any]] = []
    for _ in range(trials):  # interleaved, so that drift of the machine hits both
        for mode in MODES:
            runs[mode].append(run_job(mode, params, steps))
        ab.append(run_blocks(params, blocks))
    off = median(r["step_ms"] for r in runs["off"])
    on = median(r["step_ms"] for r in runs["on"])
    jobs_overhead = (on / off - 1) * 100
    per_step = median(r["events_per_step"] for r in runs["on"])
    paired = [(b["step_ms"] / a["step_ms"] - 1) * 100
              for a, b in zip(runs["off"], runs["on"], strict=True)]
    pairs = [pair for trial in ab for pair in trial["pairs_ms"]]
    blocks_overhead = median((b / a - 1) * 100 for a, b in pairs)
    costs = event_costs(2000 if quick else 20_000)
    # A worker's own cost per event; and, since the driver shares this machine's cores with
    # the 2 workers, half its cost per event of the two.
    per_event = costs["boundary_on_us"] - costs["boundary_off_us"] + \
        costs["sender_us_per_event"] + costs["driver_us_per_event"] / 2
    modelled = per_step * per_event / (off * 1e3) * 100
    print_table(f"timeline overhead: 2 workers, {params / 1e6:g}M parameters, commit every "
                f"step; step ms (median of {trials} trials) and overhead",
                ["measured as", "off", "on", "overhead", "spread"],
                [["separate jobs", off, on, f"{jobs_overhead:+.2f}%",
                  f"{min(paired):+.1f}%..{max(paired):+.1f}% by trial"],
                 [f"one job, {BLOCK}-step blocks", median(a for a, _ in pairs),
                  median(b for _, b in pairs), f"{blocks_overhead:+.2f}%",
                  f"{min((b / a - 1) * 100 for a, b in pairs):+.1f}%.."
                  f"{max((b / a - 1) * 100 for a, b in pairs):+.1f}% by pair"],
                 ["cost per event x events", "", "", f"{modelled:+.2f}%",
                  f"{per_step:.1f} events/step, {per_event:.2f} us each"]])
    print_table("timeline cost where it arises (microseconds, measured in this process)",
                ["boundary off", "boundary on", "sender per event", "driver per event",
                 "per step"],
                [[costs["boundary_off_us"], costs["boundary_on_us"],
                  costs["sender_us_per_event"], costs["driver_us_per_event"],
                  per_step * per_event]])
    return {"params": params, "trials": {"jobs": runs, "blocks": ab},
            "step_ms": {"off": off, "on": on}, "overhead_percent": {
                "jobs": jobs_overhead, "blocks": blocks_overhead, "modelled": modelled},
            "paired_jobs_overhead_percent": paired, "events_per_step_per_worker": per_step,
            "event_costs_us": costs}
