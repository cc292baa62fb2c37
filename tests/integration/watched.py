"""A running elasticrun job watched line by line, for tests that act in the middle of it
(kill or stop a worker once training has reached a point)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.integration.harness import assert_no_orphans, cmdline, start_job, tagged_pids

TEMPLATE = "elasticrun.worker.template"  # the template's command line, and its forks'


@dataclass
class Watched:
    """A job whose stdout and stderr lines are collected as they come."""

    proc: subprocess.Popen[str]
    tag: str
    lines: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)

    @property
    def out(self) -> str:
        return "".join(self.lines)

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    def wait_for(self, pattern: str, timeout: float = 120.0) -> re.Match[str]:
        """The first output line that matches, waiting for it (bounded)."""
        regex, deadline = re.compile(pattern), time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if (match := regex.search(line)) is not None:
                    return match
            assert self.proc.poll() is None, f"the job ended before {pattern!r}:\n" \
                                             f"{self.stderr[-3000:]}"
            time.sleep(0.05)
        raise AssertionError(f"no line matched {pattern!r} in {timeout}s")

    def signal_a_worker(self, sig: signal.Signals) -> None:
        """Sends `sig` to one of the job's workers: a process forked by its template (a
        forked worker's /proc environ is the template's, so the tag finds both; the parent
        tells them apart)."""
        for pid in tagged_pids(self.tag):
            try:
                parent = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2]
                             .split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if TEMPLATE in cmdline(parent) and TEMPLATE in cmdline(pid):
                os.kill(pid, sig)
                return
        raise AssertionError("no worker to signal")

    def finish(self, timeout: float = 120.0) -> int:
        """The job's exit code; nothing of it is left running."""
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        time.sleep(0.2)  # the readers' last lines
        assert_no_orphans(self.tag)
        return code


def watch(args: list[str], extra_env: dict[str, str] | None = None) -> Watched:
    """Starts `elasticrun ARGS` and collects its output in the background."""
    proc, tag = start_job(args, extra_env)
    job = Watched(proc, tag)
    for stream, sink in ((proc.stdout, job.lines), (proc.stderr, job.err)):
        threading.Thread(target=lambda s=stream, k=sink: k.extend(iter(s.readline, "")),
                         daemon=True).start()
    return job
