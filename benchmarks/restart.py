"""Restart: a torchrun-style script (its own DDP loop and checkpoint; a Hugging Face Trainer)
with one of its 2 workers SIGKILLed, under elasticrun and under torchrun, side by side.

Both launch lines are the same apart from the word (elasticrun's adds --event-log, whose
events split its stop further):

    elasticrun --standalone --nproc-per-node 2 --max-restarts 3 SCRIPT ARGS
    torchrun   --standalone --nproc-per-node 2 --max-restarts 3 SCRIPT ARGS

both with OMP_NUM_THREADS=1 and TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (torch 2.13's torchrun
does not restart without it, pytorch#135712). Each launcher stops every worker and starts
them all again; the script resumes from its own checkpoint.

The fault: once the first checkpoint is on disk and three more steps are done, one worker
is SIGKILLed (scripts/restart_ddp.py's rank 1, by the pid its first line prints; for
hf_trainer.py the newest worker: a child of elasticrun's template or of torchrun's agent).
Measured per trial: kill -> the restarted job's first step ("resume"), and where it went:
  stop         kill -> every old worker gone (exited or a zombie)
  spawn        -> the first new worker process exists (/proc's start time: in 10 ms ticks,
               rounded down, so it may read a few ms before "stop" ends)
  interpreter  -> its script's first line (restart_ddp.py prints times itself; for
               hf_trainer.py every line is timestamped when read, and its set-up, from
               the process start to its `start resumed_from=` line, is one phase)
  imports, rendezvous (init_process_group), model (model + optimizer + DDP),
  checkpoint (loaded), first step
and for elasticrun, from its event log: kill -> round_restarting (the driver saw the death)
-> round_started (the old round's workers all stopped). Steps lost: the last step rank 0
finished before the restart (the step in flight at the kill included) minus the checkpoint's.
For scale, "steady step": the restarted job's median step interval, its first step left out.
A job still running EXIT_WAIT_S after its last step is reported as "hung" at its end.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib import (
    PYTHON,
    REPO,
    SCRIPTS,
    TORCHRUN_WORKAROUND,
    ByLauncher,
    bench_env,
    print_table,
)
from restart_jobs import Job, parent_of, spawned_at, wait_gone, workers
from restart_phases import (
    DDP_DONE,
    DDP_PHASES,
    DDP_STEP,
    ER_SPLIT,
    HF_DONE,
    HF_PHASES,
    HF_STEP,
    PHASE,
    ddp_numbers,
    driver_split,
    fields,
    hf_numbers,
)

LAUNCHERS = ("elasticrun", "torchrun")
MODULES = {"elasticrun": "elasticrun", "torchrun": "torch.distributed.run"}
LAUNCH = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "3"]
HF_SCRIPT = REPO / "tests" / "trainers" / "scripts" / "hf_trainer.py"
DDP_SCRIPT = SCRIPTS / "restart_ddp.py"
STEPS_AFTER_CHECKPOINT = 3  # the kill comes after these further steps
START_TIMEOUT_S = 240.0  # the job's start up to the kill (torchrun + transformers: slow)
RESUME_TIMEOUT_S = 180.0
FINISH_TIMEOUT_S = 240.0  # from the restarted job's first step to its last
EXIT_WAIT_S = 10.0  # from the last step to the launcher's exit; longer: "hung" at its end
TARGET_RATIO = 5.0


@dataclass(frozen=True)
class Case:
    """One script to restart: its name in the tables, its arguments (after the script), the
    step after which the first checkpoint is on disk."""

    name: str
    script: Path
    args: tuple[str, ...]
    save_every: int

    @property
    def hf(self) -> bool:
        return self.script == HF_SCRIPT


def cases(quick: bool) -> list[Case]:
    if quick:
        return [Case("ddp ~0.1M", DDP_SCRIPT, ("--params", "1e5", "--steps", "24"), 10)]
    ddp = [Case(f"ddp ~{p / 1e6:g}M", DDP_SCRIPT, ("--params", f"{p:g}", "--steps", "30"), 10)
           for p in (1e6, 1e7)]
    return [*ddp, Case("hf trainer", HF_SCRIPT, ("--steps", "40"), 10)]


# --- one trial ----------------------------------------------------------------------------
def command(launcher: str, case: Case, out: Path, event_log: Path) -> list[str]:
    extra = ["--event-log", str(event_log)] if launcher == "elasticrun" else []
    hold = [] if case.hf else ["--hold-after", str(case.save_every + STEPS_AFTER_CHECKPOINT)]
    return [PYTHON, "-m", MODULES[launcher], *LAUNCH, *extra, str(case.script), *case.args,
            "--save-every", str(case.save_every), "--out", str(out), *hold]


def environment() -> dict[str, str]:
    return bench_env({**TORCHRUN_WORKAROUND, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
                      "TRANSFORMERS_VERBOSITY": "error"})


def trial(launcher: str, case: Case, tmp: Path) -> dict[str, Any]:
    """One job: trains past its first checkpoint, one worker killed, the restarted job's
    first step; then it trains to its last step, and how the launcher ends is recorded
    ("exit": "ok", "exit N" or "hung")."""
    out, event_log = tmp / "out", tmp / "events.jsonl"
    with Job(command(launcher, case, out, event_log), environment()) as job:
        victim, old = _victim(job, launcher, case)
        parent = parent_of(old)
        _wait_kill_step(job, launcher, case, out)
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        gone = wait_gone(old, RESUME_TIMEOUT_S)
        spawned = spawned_at(parent, old, RESUME_TIMEOUT_S)
        resumed = _first_step_after(job, case)
        job.wait_for(HF_DONE if case.hf else DDP_DONE, FINISH_TIMEOUT_S,
                     f"{launcher} {case.name}: the last step")
        ended = job.ended(EXIT_WAIT_S)
        lines = list(job.lines)
    marks = {"killed": killed, "gone": gone, "spawned": spawned, "resumed": resumed}
    numbers = hf_numbers(lines, marks) if case.hf else ddp_numbers(lines, marks)
    if launcher == "elasticrun":
        numbers.update(driver_split(event_log, killed))
    return {**numbers, "exit": ended}


def _victim(job: Job, launcher: str, case: Case) -> tuple[int, list[int]]:
    """Once the job trains: the pid to kill, and every worker's."""
    what = f"{launcher} {case.name}: the first step"
    if case.hf:
        job.wait_for(HF_STEP, START_TIMEOUT_S, what, lambda t, m: m.group(2) == "0")
        old = workers(job.tag, launcher, case.script)
        if len(old) != 2:
            raise RuntimeError(f"{what}: found workers {old}, expected 2")
        return old[-1], old  # the newest worker
    _, start = job.wait_for(PHASE, START_TIMEOUT_S, f"{what}: rank 1's start line",
                            lambda t, m: m.group(1) == "start" and "rank=1" in m.group(4))
    job.wait_for(DDP_STEP, START_TIMEOUT_S, what)
    old = workers(job.tag, launcher, case.script)
    pid = int(fields(start.group(4))["pid"])
    if pid not in old or len(old) != 2:
        raise RuntimeError(f"{what}: rank 1's pid {pid} is not one of the workers {old}")
    return pid, old


def _wait_kill_step(job: Job, launcher: str, case: Case, out: Path) -> None:
    """Until the first checkpoint is on disk and STEPS_AFTER_CHECKPOINT steps more done."""
    kill_step = case.save_every + STEPS_AFTER_CHECKPOINT
    what = f"{launcher} {case.name}: step {kill_step}"
    if case.hf:
        job.wait_for(HF_STEP, START_TIMEOUT_S, what,
                     lambda t, m: int(m.group(1)) >= kill_step and m.group(2) == "0")
        saved = out / f"checkpoint-{case.save_every}" / "trainer_state.json"
    else:
        job.wait_for(DDP_STEP, START_TIMEOUT_S, what, lambda t, m: int(m.group(1)) >= kill_step)
        saved = out / "checkpoint.pt"
    if not saved.is_file():
        raise RuntimeError(f"{what}: no checkpoint on disk")


def _first_step_after(job: Job, case: Case) -> float:
    """When the restarted job's first step was done (its own time, or when read)."""
    what = f"{case.name}: the first step after the restart"
    if case.hf:
        stamp, _ = job.wait_for(HF_STEP, RESUME_TIMEOUT_S, what,
                                lambda t, m: m.group(3) != "0" and m.group(2) == "0")
        return stamp
    _, match = job.wait_for(DDP_STEP, RESUME_TIMEOUT_S, what, lambda t, m: m.group(3) != "0")
    return float(match.group(2))


# --- the benchmark ------------------------------------------------------------------------
@dataclass
class Results(ByLauncher):
    case: Case
    trials: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def ratio(self) -> float:
        """torchrun's median resume over elasticrun's."""
        return self.stat("torchrun", "resume_s") / self.stat("elasticrun", "resume_s")

    def summary(self) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for launcher in LAUNCHERS:
            ok = self.ok(launcher)
            if not ok:
                continue
            keys = [k for k, v in ok[0].items() if isinstance(v, (int, float))]
            result[launcher] = self.spread(launcher, keys)
        if len(result) == len(LAUNCHERS):
            result["ratio"] = self.ratio()
        return result


def run_case(case: Case, trials: int) -> Results:
    results = Results(case, {launcher: [] for launcher in LAUNCHERS})
    results.collect(trials, LAUNCHERS, lambda launcher, tmp: trial(launcher, case, tmp))
    return results


def headline_rows(all_results: list[Results]) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for results in all_results:
        for launcher in LAUNCHERS:
            note = results.failures(launcher)
            if not results.ok(launcher):
                rows.append([results.case.name, launcher, "-", "-", "-", "-", "-", note])
                continue
            ratio = "" if launcher == "elasticrun" or not results.ok("elasticrun") else \
                f"{results.ratio():.1f}x"
            rows.append([results.case.name, launcher, results.stat(launcher, "resume_s"),
                         results.span(launcher, "resume_s"), ratio,
                         int(results.stat(launcher, "steps_lost")), results.endings(launcher),
                         note])
    return rows


def _pair(results: Results, launcher: str, key: str) -> list[Any]:
    if not results.ok(launcher):
        return ["-", "-"]
    return [results.stat(launcher, key), results.span(launcher, key)]


def breakdown_rows(results: Results) -> list[list[Any]]:
    phases = HF_PHASES if results.case.hf else DDP_PHASES
    rows: list[list[Any]] = []
    for key in (*phases, "resume_s"):
        rows.append([key.removesuffix("_s"), *_pair(results, "elasticrun", key),
                     *_pair(results, "torchrun", key)])
    rows.append(["(steady step)", *_pair(results, "elasticrun", "steady_step_s"),
                 *_pair(results, "torchrun", "steady_step_s")])
    for key in ER_SPLIT:
        rows.append([f"(er: kill -> {key.removesuffix('_s')})", results.stat("elasticrun", key),
                     results.span("elasticrun", key), "", ""])
    return rows


def print_results(all_results: list[Results], trials: int) -> None:
    print("\nrestart: launch lines identical apart from the word: "
          f"{{elasticrun|torchrun}} {' '.join(LAUNCH)} SCRIPT ARGS (elasticrun's adds "
          "--event-log FILE); env OMP_NUM_THREADS=1 and TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
          "for both (torch 2.13's torchrun does not restart without it, pytorch#135712)")
    print_table(f"restart: kill -> first step of the restarted job, 2 workers, one SIGKILLed "
                f"{STEPS_AFTER_CHECKPOINT} steps after the first checkpoint; median of "
                f"{trials} (min-max)",
                ["script", "launcher", "resume s", "min-max", "vs elasticrun", "steps lost",
                 "job's end", ""], headline_rows(all_results))
    for results in all_results:
        print_table(f"  {results.case.name}: where the time goes (s, median and min-max)",
                    ["phase", "elasticrun", "min-max", "torchrun", "min-max"],
                    breakdown_rows(results))
    for results in all_results:
        if not results.case.hf and results.ok("elasticrun") and results.ok("torchrun"):
            ratio = results.ratio()
            verdict = "met" if ratio >= TARGET_RATIO else "NOT met"
            print(f"  target (elasticrun <= 1/{TARGET_RATIO:g} of torchrun), {results.case.name}: "
                  f"{verdict}, torchrun / elasticrun = {ratio:.1f}")


def bench(trials: int, quick: bool) -> dict[str, Any]:
    all_results = [run_case(case, trials) for case in cases(quick)]
    print_results(all_results, trials)
    return {"launch": LAUNCH, "env": {"OMP_NUM_THREADS": "1", **TORCHRUN_WORKAROUND},
            "trials_per_case": trials,
            "cases": {r.case.name: {"script": str(r.case.script.relative_to(REPO)),
                                    "args": list(r.case.args), "save_every": r.case.save_every,
                                    "summary": r.summary(), "trials": r.trials}
                      for r in all_results}}
