"""The goodput benchmark's tools (benchmarks/goodput.py): how each starts a job of 2 hosts,
and what a host going away and coming back means to it; and a running job as the faults
(goodput_faults.py) see it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from benchlib import (
    PYTHON,
    TORCHRUN_WORKAROUND,
    Jobs,
    Tail,
    bench_env,
    elasticrun_command,
    free_port,
    tagged_pids,
    torchrun_command,
)
from goodput_faults import EVERY_HOST, HOST_A, HOSTS, Plan, is_stopped, signal_all
from restart_jobs import stat_fields

PARAMS = 1e6
DEVICE_S = 0.1  # each step's stand-in for accelerator time (model.py's device_time)
CHECKPOINT_EVERY = 10  # the torchrun-style script's disk checkpoint, in steps
PG_TIMEOUT_S = 60.0
MAX_RESTARTS = 100  # no tool may run out of restarts within the schedule
TORCHRUN_NNODES = "1:2"  # so that it trains on while a host is away
TORCHRUN_RDZV_CONF = "last_call_timeout=1"  # on at 1 node without waiting 30 s for more
START_S = 180.0  # launch -> the first step at full size
STOP_S = 30.0  # stop file -> every launcher gone
POLL_S = 0.1
# The elastic range torchrun gets with --nnodes 1:2: the job trains on one host while the
# other is away, rather than wait for it. "{one_host}": one host's slots (2; quick: 1).
ELASTIC_RANGE = ("--min-np", "{one_host}")


class Tool(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def error_marker(self) -> str:
        """What its launcher's line naming the failure holds."""
    @property
    def in_quick(self) -> bool:
        """Whether quick mode runs it too."""

    def launch_line(self, slots: int) -> str: ...
    def start(self, job: Job) -> None: ...
    def drop_host(self, job: Job, host: str) -> None: ...
    def restore_host(self, job: Job, host: str) -> None: ...


@dataclass
class Job:
    """One run of a tool: its processes, its files, and its workers as the faults see them."""

    tool: Tool
    plan: Plan
    jobs: Jobs
    tmp: Path
    launchers: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    killed: list[subprocess.Popen[str]] = field(default_factory=list)  # by a fault
    events: list[dict[str, Any]] = field(default_factory=list)
    port: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        self.stop_file = self.tmp / "stop"
        self._tail = Tail(self.tmp / "events.jsonl")

    def env(self) -> dict[str, str]:
        return bench_env({"BENCH_OUT": str(self._tail.path), "BENCH_PARAMS": f"{PARAMS:g}",
                          "BENCH_STOP_FILE": str(self.stop_file),
                          "BENCH_CHECKPOINT_DIR": str(self.tmp),
                          "BENCH_CHECKPOINT_EVERY": str(CHECKPOINT_EVERY),
                          "BENCH_PG_TIMEOUT_S": f"{PG_TIMEOUT_S:g}",
                          "BENCH_DEVICE_S": f"{DEVICE_S:g}", "BENCH_SLOW_DIR": str(self.tmp)})

    def poll(self) -> list[dict[str, Any]]:
        new = self._tail.read()
        self.events += new
        return new

    def running(self) -> bool:
        return any(proc.poll() is None for proc in self.launchers.values())

    def workers(self, host: str) -> list[int]:
        self.poll()
        tagged = set(tagged_pids(self.jobs.tag))
        return [e["pid"] for e in self.events if e["event"] == "started"
                and host in (EVERY_HOST, e["host"]) and e["pid"] in tagged
                and (stat := stat_fields(e["pid"])) is not None and stat[0] not in "ZX"]

    def drop_host(self, host: str) -> None:
        self.tool.drop_host(self, host)

    def restore_host(self, host: str) -> None:
        self.tool.restore_host(self, host)

    def slow_slot(self, host: str, index: int, factor: float | None) -> None:
        """model.py's slowness(): a file its device_time reads at every step."""
        path = self.tmp / f"slow-{host}-{index}"
        if factor is None:
            path.unlink(missing_ok=True)
            return
        staged = path.parent / f"{path.name}.new"
        staged.write_text(f"{factor:g}")
        os.replace(staged, path)

    def wait_until(self, deadline: float) -> bool:
        """Sleeps until time.time() reaches `deadline`; False (at once) if the job ended."""
        while time.time() < deadline:
            if not self.running():
                return False
            time.sleep(min(POLL_S, max(0.0, deadline - time.time())))
        return True

    def first_full_step(self) -> float | None:
        """When rank 0 first finished a step at full size (None: not within START_S)."""
        deadline = time.time() + START_S
        while time.time() < deadline and self.running():
            if found := [e["time"] for e in self.poll() if e["event"] == "step"
                         and e["rank"] == 0 and e["size"] == self.plan.full]:
                return float(found[0])
            time.sleep(POLL_S)
        return None

    def finish(self) -> str:
        """Stops the job through its stop file; how it ended."""
        self.stop_file.touch()
        self.wait_until(time.time() + STOP_S)
        still = self.running()
        stopped = [pid for pid in tagged_pids(self.jobs.tag) if is_stopped(pid)]
        signal_all(stopped, signal.SIGKILL)  # a hang the tool never dealt with
        signal_all(stopped, signal.SIGCONT)
        failed = [p for p in self.jobs.procs if p not in self.killed and p.poll() not in (0, None)]
        if still:
            return f"still running {STOP_S:g} s after the stop"
        if failed:
            return f"exit {failed[0].returncode}: " \
                   f"{self.jobs.error_line(failed[0], self.tool.error_marker)}"
        return "ok"


@dataclass(frozen=True)
class Elasticrun:
    """elasticrun -np <all slots> over a discovery script that prints the hosts file."""

    name: str
    script: Path
    args: tuple[str, ...] = ()
    in_quick: bool = True
    error_marker: str = "elasticrun:"
    env: tuple[tuple[str, str], ...] = ()  # for its workers (BENCH_FLASH=1: flash commits)

    def arguments(self, slots: int, hosts_script: Path | str) -> list[str]:
        return ["-np", str(slots * len(HOSTS)), "--host-discovery-script", str(hosts_script),
                *(flag.format(one_host=slots) for flag in ELASTIC_RANGE), *self.args]

    def launch_line(self, slots: int) -> str:
        return " ".join(["elasticrun", *self.arguments(slots, "HOSTS.sh"), "python",
                         self.script.name])

    def start(self, job: Job) -> None:
        hosts_script = job.tmp / "hosts.sh"
        hosts_script.write_text(f"#!/bin/sh\ncat {job.tmp / 'hosts'}\n")
        hosts_script.chmod(0o755)
        self._list(job, HOSTS)
        job.launchers["driver"] = job.jobs.start(
            elasticrun_command(self.arguments(job.plan.slots, hosts_script), self.script),
            {**job.env(), **dict(self.env)})

    def drop_host(self, job: Job, host: str) -> None:
        self._list(job, tuple(h for h in HOSTS if h != host))

    def restore_host(self, job: Job, host: str) -> None:
        self._list(job, HOSTS)

    @staticmethod
    def _list(job: Job, hosts: tuple[str, ...]) -> None:
        staged = job.tmp / "hosts.new"
        staged.write_text("".join(f"{host}:{job.plan.slots}\n" for host in hosts))
        os.replace(staged, job.tmp / "hosts")


@dataclass(frozen=True)
class Torchrun:
    """One torchrun launcher per host; the c10d store lives with HOST_A's."""

    name: str
    script: Path
    in_quick: bool = True
    error_marker: str = "Error"

    def arguments(self, slots: int, port: int, host: str) -> list[str]:
        return torchrun_command(self.script, slots, nnodes=TORCHRUN_NNODES, port=port,
                                is_host=host == HOST_A, rdzv_conf=TORCHRUN_RDZV_CONF,
                                extra=["--max-restarts", str(MAX_RESTARTS)])[3:]

    def launch_line(self, slots: int) -> str:
        line = " ".join([*(f"{k}={v}" for k, v in TORCHRUN_WORKAROUND.items()), "torchrun",
                         *self.arguments(slots, 0, HOST_A)[:-1], self.script.name])
        return line.replace("127.0.0.1:0", "127.0.0.1:PORT")

    def start(self, job: Job) -> None:
        for host in HOSTS:
            self.restore_host(job, host)

    def drop_host(self, job: Job, host: str) -> None:
        launcher = job.launchers.pop(host)
        os.killpg(launcher.pid, signal.SIGKILL)
        job.killed.append(launcher)

    def restore_host(self, job: Job, host: str) -> None:
        job.launchers[host] = job.jobs.start(
            [PYTHON, "-m", "torch.distributed.run",
             *self.arguments(job.plan.slots, job.port, host)],
            {**job.env(), **TORCHRUN_WORKAROUND, "BENCH_HOST": host})
