"""A lost driver: 4 local workers train on while their driver is SIGKILLed, and a driver
resumed AWAY_S later (`--state-dir`, `--resume`) takes them back; torchrun's agent killed
the same way, side by side; and re-adoption at 256 and 1,024 simulated workers
(driver_restart_scale.py).

elasticrun  `-np 4 --state-dir DIR` (scripts/er_restart_train.py, synthetic data, commit
            every 10 steps): WINDOW_S of training, the driver SIGKILLed, AWAY_S later the
            same command line plus --resume. Per trial: rank 0's steps from the kill to the
            re-adoption; its steps/s in the WINDOW_S before the kill, from the kill to the
            relaunch (no driver at all), from the relaunch to the re-adoption (the new
            driver starting up on the same 2 cores) and in the WINDOW_S after; the longest
            pause between two of its steps over all of it; from the resumed driver serving
            (its job_started event, emitted just after it listens) to its driver_resumed
            event, the driver's own "re-adopted ... in T s", and from its command to that
            event; the steps rolled back (a worker entering its elastic function again,
            from an older step); the resumed driver's exit status once the job ends.
torchrun    one agent, 4 workers (c10d rendezvous, --max-restarts 3, torch's defaults;
            scripts/torchrun_train.py, a disk checkpoint every 10 steps): the agent SIGKILLed.
            Its workers do not die with it: they train on as orphans that nothing watches or
            restarts, and a new torchrun cannot take them back (it would start 4 more beside
            them). Counted, then SIGKILLed ORPHAN_LOOK_S after the agent, as a container or
            a systemd unit does with the agent's cgroup; AWAY_S after the agent, torchrun is
            run again and its new workers resume from the last checkpoint (steps lost: the
            last step trained - the checkpoint's).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import (
    PYTHON,
    SCRIPTS,
    TAG_VAR,
    bench_env,
    free_port,
    print_table,
    read_events,
    summarize,
    tagged_pids,
    torchrun_command,
)
from driver_restart_scale import scale_bench

PARAMS = 1e6
COMMIT_EVERY = 10
WORKERS = 4
AWAY_S, WINDOW_S = 2.0, 2.0
ORPHAN_LOOK_S = 0.5  # how long torchrun's orphaned workers are watched before the kill
TIMEOUT_S = 120.0


def _wait(what: str, ready: Callable[[], bool], timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"driver_restart: no {what} within {timeout:g}s")
        time.sleep(0.02)


class Job:
    """One job's processes (own sessions, tagged) and its rank 0's steps."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp, self.out = tmp, tmp / "events.jsonl"
        self.tag = os.urandom(8).hex()
        self.env = bench_env({"BENCH_OUT": str(self.out), "BENCH_PARAMS": f"{PARAMS:g}",
                              "BENCH_COMMIT_EVERY": str(COMMIT_EVERY),
                              "BENCH_CHECKPOINT_EVERY": str(COMMIT_EVERY),
                              TAG_VAR: self.tag, **env})
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, command: list[str], **env: str) -> subprocess.Popen[bytes]:
        with open(self.tmp / f"log-{len(self.procs)}", "wb") as log:
            proc = subprocess.Popen(command, env={**self.env, **env}, stdout=log, stderr=log,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(proc)
        return proc

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in read_events(self.out) if e["event"] == kind]

    def steps(self) -> list[dict[str, Any]]:
        return [e for e in self.events("step") if e["rank"] == 0]

    def last_step(self) -> int:
        return max((e["step"] for e in self.steps()), default=0)

    def train_window(self, window: float) -> float:
        """Waits for training, then trains `window` s; returns the time of the kill to come."""
        _wait("first step", lambda: bool(self.steps()))
        time.sleep(window)
        return time.time()

    def close(self) -> None:
        for pid in tagged_pids(self.tag):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait()


def _rate(steps: list[dict[str, Any]], start: float, end: float) -> tuple[int, float]:
    inside = [e["step"] for e in steps if start < e["time"] <= end]
    return (max(inside) - min(inside) + 1 if inside else 0), (len(inside) / (end - start))


def _max_gap(steps: list[dict[str, Any]], start: float, end: float) -> float:
    times = [e["time"] for e in steps if start <= e["time"] <= end]
    return max((b - a for a, b in itertools.pairwise(times)), default=end - start)


def elasticrun_trial(tmp: Path, workers: int, away_s: float, window: float) -> dict[str, Any]:
    log, stop = tmp / "driver-events.jsonl", tmp / "stop"
    command = ["-np", str(workers), "--state-dir", str(tmp / "state"), "--event-log",
               str(log), "--start-timeout", "60", PYTHON, str(SCRIPTS / "er_restart_train.py")]
    job = Job(tmp, {"BENCH_STOP_FILE": str(stop)})
    try:
        first = job.start([PYTHON, "-m", "elasticrun", *command])
        kill = job.train_window(window)
        first.kill()
        first.wait()
        time.sleep(away_s)
        relaunched = time.time()
        second = job.start([PYTHON, "-m", "elasticrun", "--resume", *command])
        driver = lambda kind: [e for e in read_events(log) if e["type"] == kind]  # noqa: E731
        _wait("driver_resumed event", lambda: bool(driver("driver_resumed")))
        back = driver("driver_resumed")[0]
        time.sleep(window)
        stop.write_text(str(job.last_step() + 2 * COMMIT_EVERY))
        code = second.wait(TIMEOUT_S)
    finally:
        job.close()
    serving = max(e["time"] for e in driver("job_started"))
    steps, readopted = job.steps(), back["time"]
    away = _rate(steps, kill, readopted)[0]
    synced = job.events("synced")
    before = {e["pid"]: max((s["step"] for s in job.events("step") if s["pid"] == e["pid"]
                             and s["time"] < e["time"]), default=0) for e in synced}
    rollbacks = [before[e["pid"]] - e["step"] for e in synced if e["time"] > kill]
    return {"steps_away": away, "rate_with": _rate(steps, kill - window, kill)[1],
            "rate_away": _rate(steps, kill, relaunched)[1],
            "rate_restarting": _rate(steps, relaunched, readopted)[1],
            "rate_after": _rate(steps, readopted, readopted + window)[1],
            "max_gap_s": _max_gap(steps, kill - window, readopted + window),
            "serving_to_readopted_s": readopted - serving,
            "driver_says_s": back["data"]["seconds"],
            "relaunch_to_whole_s": readopted - relaunched, "restores": len(rollbacks),
            "steps_lost": sum(rollbacks), "readopted": back["data"]["readopted"],
            "exit": code, "rounds": driver("job_finished")[0]["data"]["rounds"]}


def torchrun_trial(tmp: Path, workers: int, away_s: float, window: float) -> dict[str, Any]:
    job = Job(tmp, {"BENCH_CHECKPOINT_DIR": str(tmp)})
    command = torchrun_command(SCRIPTS / "torchrun_train.py", workers, port=free_port(),
                               extra=["--max-restarts", "3"])
    try:
        agent = job.start(command, BENCH_STEPS="1000000")
        kill = job.train_window(window)
        agent.kill()
        agent.wait()
        at_kill = job.last_step()
        time.sleep(ORPHAN_LOOK_S)
        orphans = tagged_pids(job.tag)
        orphan_steps = job.last_step() - at_kill
        for pid in orphans:  # the agent's cgroup going with it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _wait("orphans' end", lambda: not tagged_pids(job.tag), 30)
        lost_at = job.last_step()
        time.sleep(max(0.0, kill + away_s - time.time()))
        relaunched = time.time()
        again = job.start(command, BENCH_STEPS=str(lost_at + 2 * COMMIT_EVERY))
        code = again.wait(TIMEOUT_S)
    finally:
        job.close()
    steps = job.steps()
    resumed = next(e for e in steps if e["time"] > relaunched)
    restored = next(e["step"] for e in job.events("synced") if e["time"] > relaunched)
    caught_up = next(e for e in steps if e["time"] > relaunched and e["step"] > lost_at)
    return {"steps_away": max(0, restored - at_kill),
            "rate_with": _rate(steps, kill - window, kill)[1],
            "max_gap_s": _max_gap(steps, kill - window, resumed["time"]),
            "kill_to_training_s": resumed["time"] - kill,
            "kill_to_caught_up_s": caught_up["time"] - kill,
            "relaunch_to_whole_s": resumed["time"] - relaunched,
            "steps_lost": lost_at - restored, "orphans": len(orphans),
            "orphan_steps": orphan_steps, "exit": code}


def bench(trials: int, quick: bool) -> dict[str, Any]:
    workers, away_s, window = (2, 0.5, 0.5) if quick else (WORKERS, AWAY_S, WINDOW_S)
    tools = ["elasticrun"] if quick else ["elasticrun", "torchrun"]
    trial = {"elasticrun": elasticrun_trial, "torchrun": torchrun_trial}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in tools}
    if quick:
        print("driver_restart: quick mode: elasticrun alone, 2 workers (torchrun: full run)")
    for _ in range(trials):  # interleaved, so that drift of the machine hits both
        for name in tools:
            with tempfile.TemporaryDirectory() as tmp:
                runs[name].append(trial[name](Path(tmp), workers, away_s, window))
    ours = runs["elasticrun"]
    print_table(f"driver restart: {workers} local workers, ~{PARAMS / 1e6:g}M parameters, "
                f"commit every {COMMIT_EVERY} steps; the driver SIGKILLed after "
                f"{window:g} s of training, resumed {away_s:g} s later; per trial (steps/s "
                f"of rank 0: {window:g} s before the kill, from it to the relaunch, from there "
                f"to re-adopted, {window:g} s after)",
                ["trial", "steps away", "steps/s with", "no driver", "restarting", "after",
                 "max pause s", "serving->re-adopted s", "driver says s",
                 "relaunch->re-adopted s", "steps lost", "exit"],
                [[i + 1, t["steps_away"], t["rate_with"], t["rate_away"], t["rate_restarting"],
                  t["rate_after"],
                  t["max_gap_s"], t["serving_to_readopted_s"], t["driver_says_s"],
                  t["relaunch_to_whole_s"], t["steps_lost"], t["exit"]]
                 for i, t in enumerate(ours)])
    medians = {name: summarize(r) for name, r in runs.items()}
    result: dict[str, Any] = {"trials": runs, "median": medians, "away_s": away_s}
    if "torchrun" in medians:
        _side_by_side(medians, trials, away_s)
    result["scale"] = scale_bench(trials, quick)
    result["load_avg"] = os.getloadavg()  # the machine may be shared: say how busy it was
    print(f"  this machine: {os.cpu_count()} cores, load average over 1/5/15 min at the end: "
          f"{' / '.join(f'{x:.1f}' for x in result['load_avg'])}")
    return result


def _side_by_side(medians: dict[str, dict[str, float]], trials: int, away_s: float) -> None:
    er, tr = medians["elasticrun"], medians["torchrun"]
    print_table(f"  side by side: the driver / torchrun's agent SIGKILLed, run again "
                f"{away_s:g} s later (median of {trials}); torchrun's workers killed "
                f"{ORPHAN_LOOK_S:g} s after their agent, restarted from their checkpoint",
                ["", "steps kept (away)", "longest pause s", "relaunch->job whole s",
                 "steps lost", "steps/s before", "exit"],
                [["elasticrun", er["steps_away"], er["max_gap_s"], er["relaunch_to_whole_s"],
                  er["steps_lost"], er["rate_with"], er["exit"]],
                 ["torchrun", tr["steps_away"], tr["max_gap_s"], tr["relaunch_to_whole_s"],
                  tr["steps_lost"], tr["rate_with"], tr["exit"]],
                 ["torchrun / elasticrun", "-", f"{tr['max_gap_s'] / er['max_gap_s']:.0f}x",
                  f"{tr['relaunch_to_whole_s'] / er['relaunch_to_whole_s']:.1f}x", "-",
                  f"{tr['rate_with'] / er['rate_with']:.2f}x", "-"]])
    print(f"  torchrun: its agent's SIGKILL left {tr['orphans']:.0f} worker(s) running, "
          f"orphaned ({tr['orphan_steps']:.0f} steps in {ORPHAN_LOOK_S:g} s, no agent to "
          f"restart them; a new torchrun cannot adopt them); training stopped "
          f"{tr['kill_to_training_s']:.1f} s from the kill and passed its last step again "
          f"{tr['kill_to_caught_up_s']:.1f} s after it")
