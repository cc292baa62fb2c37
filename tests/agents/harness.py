"""A job whose workers run under `elasticrun agent`s: the driver (`--launcher agent`) and
the agents are real processes, on loopback or each in its own network namespace.

The driver and every agent carry the job's test tag in their environment, and the workers
inherit the agent's: after the job any process with the tag is an orphan.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.integration.harness import (
    PYTHON,
    REPO,
    SCRIPTS,
    JobResult,
    assert_no_orphans,
    free_port,
    is_zombie,
    job_env,
    read_records,
    tagged_pids,
)
from tests.integration.progress import read_progress

TOKEN = "agent-token-for-tests-0123456789"
TRAIN = [PYTHON, str(SCRIPTS / "elastic_train.py")]
COMMON = ["--start-timeout", "60", "--discovery-interval", "0.2"]


def in_ns(ns: str | None, argv: Sequence[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv] if ns else list(argv)


def train_env(log_dir: Path, progress: Path, epochs: int = 3, sleep: float = 0.0,
              faults: str = "", samples: int = 64, slow_below: int = 0, await_size: int = 0,
              stop_file: Path | None = None) -> dict[str, str]:
    """elastic_train.py's environment. A scenario of several phases gives a stop file and
    many epochs, and touches the file when done: a loaded machine does not end it early."""
    log_dir.mkdir(parents=True, exist_ok=True)
    return {"TRAIN_SAMPLES": str(samples), "TRAIN_EPOCHS": str(epochs), "TRAIN_BATCH": "4",
            "TRAIN_STEP_SLEEP": str(sleep), "FAULTS": faults, "LOG_DIR": str(log_dir),
            "PROGRESS_FILE": str(progress), "TRAIN_SLOW_BELOW": str(slow_below),
            "TRAIN_AWAIT_SIZE": str(await_size),
            **({"TRAIN_STOP_FILE": str(stop_file)} if stop_file else {})}


class AgentJob:
    def __init__(self, tmp: Path, args: Sequence[str], env: dict[str, str],
                 ns: str | None = None, driver_addr: str = "127.0.0.1") -> None:
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://{driver_addr}:{self.port}"
        self.token_file = tmp / "token"
        self.token_file.write_text(TOKEN + "\n")
        self.log_dir = Path(env["LOG_DIR"])
        self.progress = Path(env["PROGRESS_FILE"])
        self.env, self.tag = job_env(env)
        self.ns = ns
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.proc = self.start_driver(args)

    def start_driver(self, args: Sequence[str]) -> subprocess.Popen[str]:
        """The job's driver, on the job's port (a restarted one: the same arguments with
        --resume)."""
        self.proc = subprocess.Popen(
            in_ns(self.ns, [PYTHON, "-m", "elasticrun", "--launcher", "agent", "--port",
                            str(self.port), "--agent-token-file", str(self.token_file),
                            *args]),
            env=self.env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        return self.proc

    # --- agents -----------------------------------------------------------------------------
    def start_agent(self, host: str, slots: int, ns: str | None = None,
                    extra: Sequence[str] = (), token_file: Path | None = None
                    ) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"agent-{host}.log", "ab")  # noqa: SIM115 - the child's
        with log:
            agent = subprocess.Popen(
                in_ns(ns, [PYTHON, "-m", "elasticrun", "agent", "--driver", self.url,
                           "--token-file", str(token_file or self.token_file), "--host", host,
                           "--slots", str(slots), *extra]),
                env=self.env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self.agents[host] = agent
        return agent

    def agent_log(self, host: str) -> str:
        return (self.tmp / f"agent-{host}.log").read_text(errors="replace")

    def wait_agent(self, host: str, timeout: float = 30.0) -> int:
        try:
            return self.agents[host].wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"agent {host} did not exit within {timeout}s:\n"
                                 f"{self.agent_log(host)[-2000:]}") from None

    def workers_on(self, host: str) -> list[int]:
        """The live workers on `host`, by the records they wrote (a worker forked from a
        template shows the template's environment in /proc, not its own)."""
        logged = {r["pid"] for r in read_records(self.log_dir) if r.get("host") == host}
        return [pid for pid in tagged_pids(self.tag) if pid in logged and not is_zombie(pid)]

    # --- the job ----------------------------------------------------------------------------
    def step(self) -> tuple[int, int]:
        return read_progress(self.progress)

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/status", timeout=10) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    def wait_until(self, what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if check():
                    return
            except (urllib.error.URLError, ConnectionError):
                pass
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                raise AssertionError(f"job ended while waiting for {what}:\n{err[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.05)

    def finish(self, timeout: float = 120.0, ok: bool = True) -> JobResult:
        started = time.monotonic()
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            out, err = self.proc.communicate()
            raise AssertionError(f"job did not finish:\n{err[-4000:]}") from None
        result = JobResult(self.proc.returncode, out, err, time.monotonic() - started,
                           time.time(), self.tag, self.log_dir)
        result.records = list(read_records(self.log_dir))
        if ok:
            assert result.returncode == 0, f"job failed:\n{out[-2000:]}\n{err[-4000:]}"
        return result

    def kill_all(self) -> None:
        """Whatever is left of the job: driver, agents, workers."""
        kill_job([self.proc, *self.agents.values()], self.tag)

    def close(self, within: float = 10.0) -> None:
        """Ends the test: every agent has exited, nothing of the job is left."""
        try:
            for host in list(self.agents):
                self.wait_agent(host, within)
            assert_no_orphans(self.tag, within=within)
        finally:
            self.kill_all()


def kill_job(procs: Sequence[subprocess.Popen[Any]], tag: str) -> None:
    """Whatever is left of a job: the processes a test started, then every tagged one."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for pid in tagged_pids(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
