"""Runs the launcher as a caller does (its output read through pipes) and times its end.

The job's end is the driver's last word (the "... finished" line or its error line) or,
for an interrupted job, the signal. Measured from there: when the launcher exited, when
its pipes reached EOF (nothing it started still holds them), and which of the job's
processes were still alive at that point.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.integration.harness import PYTHON, REPO, cmdline, is_zombie, job_env, tagged_pids

LAST_WORDS = (" finished", "elasticrun: error")


@dataclass
class JobEnd:
    code: int | None = None
    ended: float | None = None  # the driver's last word, or the signal (time.monotonic())
    exited: float | None = None
    eof: float | None = None
    left: list[str] = field(default_factory=list)  # command lines of survivors
    output: list[str] = field(default_factory=list)
    stack: str = ""  # where a launcher that did not exit was (py-spy dump, if installed)

    def after_end(self, moment: float | None) -> float | None:
        return None if moment is None or self.ended is None else moment - self.ended

    @property
    def lateness(self) -> float:
        """How long after the job's end the launcher exited and its pipes closed
        (infinite if either never happened)."""
        waits = [self.after_end(self.exited), self.after_end(self.eof)]
        return max(w if w is not None else float("inf") for w in waits)


def run_and_time_end(args: Sequence[str], *, deadline: float = 150.0,
                     interrupt: signal.Signals | None = None, interrupt_when: str = "round 1:",
                     pythonpath: Path = REPO, extra_env: dict[str, str] | None = None) -> JobEnd:
    """Runs `elasticrun ARGS`; with `interrupt`, sends it that signal once a line containing
    `interrupt_when` is printed. Kills whatever is left at the end (and reports it)."""
    env, tag = job_env(extra_env)
    env["PYTHONPATH"] = f"{pythonpath}:{env['PYTHONPATH']}"
    proc = subprocess.Popen([PYTHON, "-m", "elasticrun", *args], env=env, cwd=pythonpath,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    end = JobEnd()

    def read() -> None:
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, ""):
            end.output.append(line.rstrip("\n"))
            if interrupt is not None and end.ended is None and interrupt_when in line:
                end.ended = time.monotonic()
                proc.send_signal(interrupt)
            elif interrupt is None and any(word in line for word in LAST_WORDS):
                end.ended = time.monotonic()
        end.eof = time.monotonic()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        try:
            end.code = proc.wait(timeout=deadline)
            end.exited = time.monotonic()
        except subprocess.TimeoutExpired:
            pass
        reader.join(timeout=10.0)
        if end.code is None and (spy := shutil.which("py-spy")) is not None:
            dump = subprocess.run([spy, "dump", "--pid", str(proc.pid)], capture_output=True,
                                  text=True, timeout=30, check=False)
            end.stack = dump.stdout + dump.stderr
        end.left = [cmdline(pid) for pid in _survivors(tag)]
    finally:  # also when the caller is interrupted (Ctrl-C in the stress loop)
        for pid in _survivors(tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return end


def _survivors(tag: str) -> list[int]:
    return [pid for pid in tagged_pids(tag) if not is_zombie(pid)]

