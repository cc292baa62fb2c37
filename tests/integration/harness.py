"""Runs real elasticrun jobs for integration tests and checks nothing is left behind.

Every job gets a unique tag in its environment; the driver passes the environment on to
its workers, so after the job any process still carrying the tag is an orphan.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
PYTHON = sys.executable
TAG_VAR = "ELASTICRUN_TEST_TAG"
# Every job this test session starts carries a tag beginning with this: the session cleans
# up its own jobs, never another session's (two pytest runs may share the machine).
SESSION_TAG = uuid.uuid4().hex[:12]


@dataclass
class JobResult:
    returncode: int
    stdout: str
    stderr: str
    duration: float
    ended_at: float  # wall clock, comparable with the "time" of logged records
    tag: str
    log_dir: Path | None = None
    records: list[dict] = field(default_factory=list)

    def events(self, kind: str) -> list[dict]:
        return [r for r in self.records if r["event"] == kind]

    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("elasticrun: error")]


def tagged_pids(tag: str | None, var: str = TAG_VAR) -> list[int]:
    """Processes whose environment has var=tag, or, when tag is None, any tag of this test
    session (root can read every /proc/*/environ)."""
    needle = f"{var}={tag if tag is not None else SESSION_TAG + '.'}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            if needle in environ if tag is not None else any(
                    v.startswith(needle) for v in environ):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def assert_no_orphans(tag: str, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while True:
        left = [pid for pid in tagged_pids(tag) if not is_zombie(pid)]
        if not left:
            return
        if time.monotonic() > deadline:
            details = [cmdline(pid) for pid in left]
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            raise AssertionError(f"processes left behind: {details}")
        time.sleep(0.1)


def env_of(pid: int) -> dict[str, str]:
    """A process's environment (as it started), {} when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return f"<pid {pid}>"


def free_port() -> int:
    """A port for a job to listen on, free now and taken from below the kernel's ephemeral
    range: a port found free by binding port 0 is one every connect() and bind(0) on this
    machine draws from next, and another test's socket took one before its job bound it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(100 if low > 4096 else 0):
        port = 2048 + secrets.randbelow(low - 2048)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # no room below the range: the kernel's choice
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def job_env(extra: dict[str, str] | None = None) -> tuple[dict[str, str], str]:
    tag = f"{SESSION_TAG}.{uuid.uuid4().hex}"
    env = dict(os.environ)
    env[TAG_VAR] = tag
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("ELASTICRUN_RENDEZVOUS_ADDR", None)
    # Jobs get elasticrun's own intra-op thread default, whatever this machine exports.
    env.pop("OMP_NUM_THREADS", None)
    # A worker that dies of SIGABRT/SIGSEGV prints every thread's Python stack: a rare
    # crash in a full run says where it happened (an abort at a worker's exit, once in 7
    # full runs, said nothing).
    env.setdefault("PYTHONFAULTHANDLER", "1")
    if extra:
        env.update(extra)
    return env, tag


def start_job(
    args: Sequence[str], extra_env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[subprocess.Popen[str], str]:
    env, tag = job_env(extra_env)
    proc = subprocess.Popen(
        [PYTHON, "-m", "elasticrun", *args],
        env=env, cwd=cwd or REPO, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    return proc, tag


def run_job(
    args: Sequence[str],
    extra_env: dict[str, str] | None = None,
    timeout: float = 120.0,
    log_dir: Path | None = None,
    cwd: Path | None = None,
) -> JobResult:
    """Runs `elasticrun ARGS` to its end, then checks that no process of it survived."""
    env_extra = dict(extra_env or {})
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        env_extra["LOG_DIR"] = str(log_dir)
    started = time.monotonic()
    proc, tag = start_job(args, env_extra, cwd)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        assert_no_orphans(tag, within=0)
        raise AssertionError(
            f"elasticrun did not finish in {timeout}s:\n{stdout}\n{stderr}") from None
    result = JobResult(proc.returncode, stdout, stderr, time.monotonic() - started, time.time(),
                       tag, log_dir)
    assert_no_orphans(tag)
    if log_dir is not None:
        result.records = list(read_records(log_dir))
    return result


def read_records(log_dir: Path) -> Iterator[dict]:
    for path in sorted(log_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                yield json.loads(line)


def write_script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path
