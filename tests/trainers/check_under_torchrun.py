"""Runs the user scripts of tests/trainers/scripts under real torchrun, as their users would.

    python tests/trainers/check_under_torchrun.py [ddp|hf|lightning ...] [--kill-rank R] [-v]

For each script: the import time of its framework; a clean 2-worker run of 40 steps (rc 0,
`done steps=40`); then the same with --max-restarts 3 and one worker SIGKILLed after the first
checkpoint, which must end rc 0 after one restart that resumed from that checkpoint, with no
process of the job left. Prints what it did and the timings; exits 1 when a check failed.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "scripts"
STEPS, SAVE_EVERY, STEP_SLEEP = 40, 10, 0.2
STEP = re.compile(r"step (\d+) rank (\d+) restart (\d+)")
START = re.compile(r"start resumed_from=(\d+) world=(\d+)")
DONE = re.compile(r"done steps=(\d+) world=(\d+)")


def _hf_saved(out: Path) -> bool:
    return any(out.glob("checkpoint-*/trainer_state.json"))


@dataclass(frozen=True)
class Script:
    path: Path
    imports: str
    saved: Callable[[Path], bool]


CASES = {
    "ddp": Script(SCRIPTS / "ddp_checkpoint.py", "import torch.distributed, torch.nn.parallel",
                  lambda out: (out / "checkpoint.pt").is_file()),
    "hf": Script(SCRIPTS / "hf_trainer.py",
                 "from transformers import BertForSequenceClassification, Trainer", _hf_saved),
    "lightning": Script(SCRIPTS / "lightning_train.py",
                        "import lightning, lightning.pytorch.strategies",
                        lambda out: (out / "last.ckpt").is_file()),
}


@dataclass
class Run:
    rc: int
    wall: float
    lines: list[tuple[float, str]] = field(default_factory=list)
    stderr: str = ""
    killed: tuple[float, int, int] | None = None  # (time, pid, rank)
    leftovers: list[str] = field(default_factory=list)

    def first(self, pattern: re.Pattern[str]) -> tuple[float, re.Match[str]] | None:
        for at, line in self.lines:
            if match := pattern.search(line):
                return at, match
        return None

    def all(self, pattern: re.Pattern[str]) -> list[tuple[float, re.Match[str]]]:
        return [(at, m) for at, line in self.lines for m in pattern.finditer(line)]


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env.update(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1")
    return env


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


def session_members(sid: int) -> list[str]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[4]) == sid:
            members.append(f"{entry.name} {cmdline}")
    return members


def torchrun(script: Script, out: Path, extra: list[str], kill_rank: int | None) -> Run:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", *extra, str(script.path),
               "--steps", str(STEPS), "--save-every", str(SAVE_EVERY), "--out", str(out)]
    if kill_rank is not None:
        command += ["--step-sleep", str(STEP_SLEEP)]
    print("  $", " ".join(command[1:]), flush=True)
    with tempfile.TemporaryFile() as stderr:
        began = time.monotonic()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr,
                                env=environment(), start_new_session=True, text=True)
        run = Run(rc=-1, wall=0.0)

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                run.lines.append((time.monotonic() - began, line.rstrip("\n")))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            while proc.poll() is None:
                if kill_rank is not None and run.killed is None and ready_to_kill(script, out, run):
                    run.killed = kill(proc.pid, kill_rank, began)
                time.sleep(0.05)
            run.rc = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        run.wall = time.monotonic() - began
        reader.join(timeout=10)
        time.sleep(0.5)
        run.leftovers = session_members(proc.pid)
        for member in run.leftovers:
            os.kill(int(member.split()[0]), signal.SIGKILL)
        stderr.seek(0)
        run.stderr = stderr.read().decode(errors="replace")
    return run


def ready_to_kill(script: Script, out: Path, run: Run) -> bool:
    steps = [int(m.group(1)) for _, m in run.all(STEP)]
    return bool(steps) and max(steps) >= SAVE_EVERY + 3 and script.saved(out)


def kill(agent: int, rank: int, began: float) -> tuple[float, int, int] | None:
    for pid in children(agent):
        if rank_of(pid) == rank:
            os.kill(pid, signal.SIGKILL)
            return time.monotonic() - began, pid, rank
    return None


def measure_imports(script: Script) -> float:
    code = (f"import time; t = time.perf_counter(); {script.imports}; "
            "print(time.perf_counter() - t)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=environment(), check=True)
    return float(result.stdout.strip().splitlines()[-1])


def report(run: Run) -> None:
    start, done = run.first(START), run.first(DONE)
    first = run.lines[0][0] if run.lines else float("nan")
    print(f"  rc={run.rc} wall={run.wall:.1f}s first line at {first:.1f}s", end="")
    if start and done:
        print(f", start->done {done[0] - start[0]:.1f}s", end="")
    print(flush=True)
    for at, line in run.lines:
        if START.search(line) or DONE.search(line):
            print(f"    {at:6.1f}s | {line}")


def check(name: str, kill_rank: int, verbose: bool) -> list[str]:
    script, failures = CASES[name], []
    print(f"== {name}: {script.path.name}", flush=True)
    print(f"  imports ({script.imports}): {measure_imports(script):.2f}s", flush=True)
    with tempfile.TemporaryDirectory(prefix=f"trainers-{name}-") as tmp:
        clean = torchrun(script, Path(tmp) / "clean", [], None)
        report(clean)
        done = clean.first(DONE)
        if clean.rc != 0 or not done or int(done[1].group(1)) != STEPS:
            failures.append(f"{name}: clean run rc={clean.rc}, done={done and done[1].group(0)}")
        failures += [f"{name}: left running: {m}" for m in clean.leftovers]

        killed = torchrun(script, Path(tmp) / "killed", ["--max-restarts", "3"], kill_rank)
        report(killed)
        failures += verify_resume(name, killed)
    if failures or verbose:
        for text in (clean.stderr, killed.stderr):
            lines = text.splitlines() if verbose else text.splitlines()[-60:]
            print("  stderr:", *lines, sep="\n    ")
    return failures


def verify_resume(name: str, run: Run) -> list[str]:
    failures = [f"{name}: left running: {m}" for m in run.leftovers]
    if run.killed is None:
        return [*failures, f"{name}: no worker of rank to kill was found in time"]
    at, pid, rank = run.killed
    before = [int(m.group(1)) for t, m in run.all(STEP) if t < at]
    print(f"  SIGKILL rank {rank} (pid {pid}) at {at:.1f}s, after step {max(before, default=0)}")
    starts = run.all(START)
    restarted = [(t, m) for t, m in run.all(STEP) if m.group(3) == "1"]
    if restarted:
        first = restarted[0]
        print(f"  first step of restart 1 at {first[0]:.1f}s ({first[0] - at:.1f}s after the"
              f" kill): {first[1].group(0)}")
    resumed = [int(m.group(1)) for t, m in starts if t > at]
    done = run.first(DONE)
    if run.rc != 0:
        failures.append(f"{name}: rc={run.rc} after the kill")
    if not resumed or resumed[0] <= 0:
        failures.append(f"{name}: no `start resumed_from=<step > 0>` after the kill: {resumed}")
    if not restarted:
        failures.append(f"{name}: no step line with `restart 1`")
    elif resumed and int(restarted[0][1].group(1)) != resumed[0] + 1:
        failures.append(f"{name}: first step after resuming from {resumed[0]} was "
                        f"{restarted[0][1].group(1)}")
    if not done or int(done[1].group(1)) != STEPS:
        failures.append(f"{name}: no `done steps={STEPS}`")
    if any(m.group(3) not in ("0", "1") for _, m in run.all(STEP)):
        failures.append(f"{name}: more than one restart")
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="|".join(CASES))
    parser.add_argument("--kill-rank", type=int, default=1)
    parser.add_argument("-v", "--verbose", action="store_true", help="print torchrun's stderr")
    args = parser.parse_args()
    if unknown := set(args.names) - set(CASES):
        parser.error(f"unknown: {' '.join(sorted(unknown))}")
    failures = []
    for name in args.names or list(CASES):
        failures += check(name, args.kill_rank, args.verbose)
    print("\n".join(["FAILED:", *failures]) if failures else "all checks passed", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
