"""Flash commits: the steps a restart redoes with them and without, and what they cost.

1. Steps redone per failure. A torchrun-style script, 2 workers, at its framework's default
   disk-checkpoint cadence: a Hugging Face Trainer (save_steps=500, the Trainer's default:
   in a 45-step run it never writes one), Lightning (once an epoch, its default: 16 steps at
   2 workers; written as OUT/last.ckpt, --save-every 16, since the script resumes from that
   file only and from none with --save-every 0), and a plain DDP loop with its own
   checkpoint every 500 steps (tests/trainers/scripts/). One worker (the newest process) is
   SIGKILLed once rank 0 has printed step KILL_AT. Each runs under

       elasticrun --standalone --nproc-per-node 2 --max-restarts 3 SCRIPT ARGS --flash
       torchrun   --standalone --nproc-per-node 2 --max-restarts 3 SCRIPT ARGS

   (the same line apart from the word and --flash, which adds elasticrun's ElasticCallback,
   or FlashCommits to the plain loop; env OMP_NUM_THREADS=1 and
   TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for both, as benchmarks/restart.py has them), each
   step followed by a sleep of STEP_SLEEP_S (the scripts' --step-sleep) so that the kill
   lands near step KILL_AT. Both launchers restart every worker; the script resumes from
   its checkpoint (or, with --flash, from the newer of it and the job's flash commit).
   Measured: steps redone = the last step trained before the kill (the highest step any
   rank printed before the restart) minus the step the restarted job resumed from (its
   `start resumed_from=` line), and kill -> rank 0's first step after.
   And an elasticrun.torch script (scripts/er_train.py under `elasticrun -np 2`, a commit
   every step, ~0.01M parameters): rank 1 SIGKILLs itself once step KILL_AT is done; the
   survivor rolls back in-process to the last commit and goes on (no restart). Its steps
   redone: the last step done before the recovery minus the step restored (a step in
   flight at the kill, never finished, is not counted in either case).

2. Cost per step. A plain training loop (an MLP whose width x width layer holds nearly all
   of ~1M, ~10M and ~100M parameters; AdamW; a fixed batch of 32; one process, one
   intra-op thread) with FlashCommits.commit(step) at every step's end, against the same
   loop without it; runs alternate, every other trial in the other order
   (benchmarks/flash_cost.py, in a process of its own, the commits in /dev/shm as under
   the launcher). Reported: steps/s of each and their ratio (the median of each trial's
   on/off ratio, and its range), the cadence in force at the end (stats().every), the
   cadence's recent median of the copy (stats().copy_s), the median duration of the
   commit() calls that took a commit (the first left out: it allocates the buffers), the
   first such call, commits taken in the measured steps, commits written and put off
   (stats().commits, .skipped), and the writer's final flush.
   The 100M size runs in the full mode only.

BENCH_FLASH_CASES (e.g. "ddp,hf") and BENCH_FLASH_SIZES (e.g. "1e6,1e7") pick some.
"""

from __future__ import annotations

import os
import re
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
    Jobs,
    bench_env,
    elasticrun_command,
    print_table,
    read_events,
)
from flash_cost_runs import cost_runs, cost_summary, print_costs, sizes
from restart import HF_SCRIPT, LAUNCH, MODULES, environment
from restart_jobs import Job, workers

TRAINERS = REPO / "tests" / "trainers" / "scripts"
LIGHTNING_SCRIPT = TRAINERS / "lightning_train.py"
DDP_SCRIPT = TRAINERS / "ddp_checkpoint.py"
ER_SCRIPT = SCRIPTS / "er_train.py"
LAUNCHERS = ("elasticrun", "torchrun")
STEP_SLEEP_S = 0.1
START_TIMEOUT_S = 240.0  # the job's start up to the kill (torchrun + transformers: slow)
RESUME_TIMEOUT_S = 180.0
FINISH_TIMEOUT_S = 240.0
EXIT_WAIT_S = 10.0  # from the last step to the launcher's exit; longer: "hung" at its end
ER_PARAMS = 1e4

STEP = re.compile(r"step (\d+) rank (\d+) restart (\d+)")
START = re.compile(r"start resumed_from=(\d+) world=(\d+)")
DONE = re.compile(r"done steps=\d+ world=\d+")


# --- part 1: steps redone -----------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One script killed once: its key (BENCH_FLASH_CASES), its name in the tables, its
    steps, the step after which a worker is killed, its disk-checkpoint cadence (its
    --save-every) and what that cadence is."""

    key: str
    name: str
    script: Path
    steps: int
    kill_at: int
    save_every: int
    checkpoint: str

    @property
    def elastic(self) -> bool:
        """An elasticrun.torch script (er_train.py): elasticrun alone, no restart."""
        return self.script == ER_SCRIPT

    @property
    def launchers(self) -> tuple[str, ...]:
        return ("elasticrun",) if self.elastic else LAUNCHERS


def cases(quick: bool) -> list[Case]:
    if quick:
        found = [Case("ddp", "plain DDP loop", DDP_SCRIPT, 10, 6, 500, "every 500 steps"),
                 Case("elastic", "elasticrun.torch", ER_SCRIPT, 12, 6, 1, "a commit every step")]
    else:
        found = [
            Case("hf", "HF Trainer", HF_SCRIPT, 45, 37, 500, "every 500 steps (default)"),
            Case("lightning", "Lightning", LIGHTNING_SCRIPT, 45, 37, 16,
                 "once an epoch = 16 steps (default)"),
            Case("ddp", "plain DDP loop", DDP_SCRIPT, 45, 37, 500, "every 500 steps"),
            Case("elastic", "elasticrun.torch", ER_SCRIPT, 45, 37, 1, "a commit every step"),
        ]
    chosen = os.environ.get("BENCH_FLASH_CASES")
    if chosen:
        found = [case for case in found if case.key in chosen.split(",")] or found
    return found


def command(launcher: str, case: Case, out: Path) -> list[str]:
    flash = ["--flash"] if launcher == "elasticrun" else []
    return [PYTHON, "-m", MODULES[launcher], *LAUNCH, str(case.script),
            "--steps", str(case.steps), "--save-every", str(case.save_every),
            "--out", str(out), "--step-sleep", str(STEP_SLEEP_S), *flash]


def restart_trial(launcher: str, case: Case, tmp: Path) -> dict[str, Any]:
    """One job: trains to step KILL_AT, one worker killed, the restarted job's first step;
    then its last step, and how the launcher ends ("ok", "exit N" or "hung")."""
    what = f"{launcher} {case.name}"
    with Job(command(launcher, case, tmp / "out"), environment()) as job:
        job.wait_for(STEP, START_TIMEOUT_S, f"{what}: step {case.kill_at}",
                     lambda t, m: int(m.group(1)) >= case.kill_at and m.group(2) == "0")
        old = workers(job.tag, launcher, case.script)
        if len(old) != 2:
            raise RuntimeError(f"{what}: found workers {old}, expected 2")
        killed = time.time()
        os.kill(old[-1], signal.SIGKILL)  # the newest worker
        resumed, _ = job.wait_for(STEP, RESUME_TIMEOUT_S, f"{what}: the first step after",
                                  lambda t, m: m.group(3) != "0" and m.group(2) == "0")
        job.wait_for(DONE, FINISH_TIMEOUT_S, f"{what}: the last step")
        ended = job.ended(EXIT_WAIT_S)
        lines = list(job.lines)
    return {**_redone(lines, killed, what), "resume_s": resumed - killed, "exit": ended}


def _redone(lines: list[tuple[float, str]], killed: float, what: str) -> dict[str, int]:
    """From the job's output: the last step trained before the restart, the step resumed
    from (the first start line after the kill), the restarted job's first step."""
    before = [int(m.group(1)) for _, line in lines
              if (m := STEP.search(line)) and m.group(3) == "0"]
    resumed = [int(m.group(1)) for stamp, line in lines
               if stamp > killed and (m := START.search(line))]
    after = [int(m.group(1)) for _, line in lines
             if (m := STEP.search(line)) and m.group(3) != "0" and m.group(2) == "0"]
    if not before or not resumed or not after:
        raise RuntimeError(f"{what}: no step before, start line or step after the restart")
    last = max(before)
    return {"last_step": last, "resumed_from": resumed[0], "steps_redone": last - resumed[0],
            "first_step_after": after[0]}


def elastic_trial(case: Case, tmp: Path) -> dict[str, Any]:
    """er_train.py under `elasticrun -np 2`, a commit every step; rank 1 kills itself once
    step KILL_AT is done."""
    out = tmp / "events.jsonl"
    env = bench_env({"BENCH_OUT": str(out), "BENCH_PARAMS": f"{ER_PARAMS:g}",
                     "BENCH_STEPS": str(case.steps), "BENCH_KILL_STEP": str(case.kill_at),
                     "BENCH_KILL_RANK": "1", "BENCH_COMMIT_EVERY": "1"})
    with Jobs() as jobs:
        jobs.start(elasticrun_command(["-np", "2"], case.script), env)
        jobs.wait(START_TIMEOUT_S + FINISH_TIMEOUT_S, f"elasticrun {case.name}", progress=out)
    events = read_events(out)
    kill = next(e for e in events if e["event"] == "kill")
    synced = next(e for e in events if e["event"] == "synced" and e["time"] > kill["time"])
    last = max(e["step"] for e in events if e["event"] == "step" and e["time"] < synced["time"])
    first = next(e for e in events if e["event"] == "step" and e["time"] > synced["time"])
    return {"last_step": last, "resumed_from": synced["step"],
            "steps_redone": last - synced["step"], "first_step_after": first["step"],
            "resume_s": first["time"] - kill["time"], "exit": "ok"}


@dataclass
class Restarts(ByLauncher):
    case: Case
    trials: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        keys = ("last_step", "resumed_from", "steps_redone", "resume_s")
        return {launcher: self.spread(launcher, keys)
                for launcher in self.case.launchers if self.ok(launcher)}


def run_restarts(case: Case, trials: int) -> Restarts:
    results = Restarts(case, {launcher: [] for launcher in case.launchers})
    results.collect(trials, case.launchers,
                    lambda launcher, tmp: elastic_trial(case, tmp) if case.elastic
                    else restart_trial(launcher, case, tmp))
    return results


def _label(case: Case, launcher: str) -> str:
    if case.elastic:
        return "elasticrun -np 2 (in-process)"
    return "elasticrun --flash" if launcher == "elasticrun" else "torchrun"


def restart_rows(all_results: list[Restarts]) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for results in all_results:
        case = results.case
        for launcher in case.launchers:
            note = results.failures(launcher)
            head = [case.name, _label(case, launcher), case.checkpoint]
            if not results.ok(launcher):
                rows.append([*head, "-", "-", "-", "-", "-", "-", note])
                continue
            rows.append([*head, _steps(results, launcher, "last_step"),
                         _steps(results, launcher, "resumed_from"),
                         _steps(results, launcher, "steps_redone"),
                         results.stat(launcher, "resume_s"), results.span(launcher, "resume_s"),
                         results.endings(launcher), note])
    return rows


def _steps(results: Restarts, launcher: str, key: str) -> str:
    """A step count's median, and its range where trials differ."""
    low, high = results.stat(launcher, key, min), results.stat(launcher, key, max)
    middle = f"{results.stat(launcher, key):g}"
    return middle if low == high else f"{middle} ({low:g}-{high:g})"


def print_restarts(all_results: list[Restarts], trials: int) -> None:
    print("\nflash: launch lines identical apart from the word and --flash: "
          f"{{elasticrun|torchrun}} {' '.join(LAUNCH)} SCRIPT --steps N --save-every K "
          f"--step-sleep {STEP_SLEEP_S:g} [--flash]; env OMP_NUM_THREADS=1 and "
          "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for both")
    kills = ", ".join(sorted({f"{r.case.name} at step {r.case.kill_at}" for r in all_results}))
    print_table(f"flash: steps redone per failure, 2 workers, one SIGKILLed ({kills}); "
                f"redone = last step trained before the kill - step resumed from; median of "
                f"{trials} (min-max)",
                ["script", "launcher", "disk checkpoint", "last step", "resumed from",
                 "redone", "kill -> step s", "min-max", "job's end", ""],
                restart_rows(all_results))


# --- the benchmark ------------------------------------------------------------------------
def bench(trials: int, quick: bool) -> dict[str, Any]:
    restarts = [run_restarts(case, trials) for case in cases(quick)]
    print_restarts(restarts, trials)
    all_sizes = sizes(quick)
    costs = {f"{size.params:g}": {**result, "summary": cost_summary(result)}
             for size, result in zip(all_sizes, cost_runs(all_sizes, trials), strict=True)}
    print_costs(costs, all_sizes, trials)
    return {"launch": LAUNCH, "env": {"OMP_NUM_THREADS": "1", **TORCHRUN_WORKAROUND},
            "step_sleep_s": STEP_SLEEP_S, "trials_per_case": trials,
            "restart": {r.case.key: {"name": r.case.name,
                                     "script": str(r.case.script.relative_to(REPO)),
                                     "steps": r.case.steps, "kill_at": r.case.kill_at,
                                     "save_every": r.case.save_every,
                                     "checkpoint": r.case.checkpoint,
                                     "summary": r.summary(), "trials": r.trials}
                        for r in restarts},
            "cost": costs}
