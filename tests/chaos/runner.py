"""A seeded chaos runner: trains a real job across local and SSH hosts while injecting
faults at random moments, then checks that nothing was lost.

Faults: SIGKILL of a worker, an exception in a worker, SIGSTOP of a worker (a hang, found
by hang detection), SIGKILL of every worker at once (a total loss: the job goes on from the
host snapshot of a commit, which the driver's defaults keep), removal and return of hosts
through discovery, and a discovery script that fails or hangs for a while. After each
fault the runner waits until training has moved on (3 steps), so every fault counts only
if the job survived it; that wait is the fault's recovery time, reported by kind.
CHAOS_HANG_DETECTION=0 runs the job as it ran before hang detection (--no-hang-detection
--collective-timeout 4), for comparison.

Used by tests/chaos/test_chaos.py (a short CI run, and the long mode by hand:
CHAOS_FAULTS=100 python -m pytest tests/chaos -s).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tests.integration.harness import PYTHON, REPO, SCRIPTS, TAG_VAR, env_of, job_env, read_records

KINDS = {  # fault -> weight
    "sigkill": 3, "sigkill_all": 1, "exception": 4, "sigstop": 1, "remove_host": 2,
    "add_host": 2, "discovery_fails": 1, "discovery_hangs": 1,
}
MIN_NP = 2
# Without hang detection, a SIGSTOP is found by the collective timeout: kept short then.
WITHOUT_HANG_DETECTION = ["--no-hang-detection", "--collective-timeout", "4"]
RECOVERY_TIMEOUT_S = 120.0
WORKER_LINE = re.compile(r"\[\d+\]<\w+>:")

DISCOVERY = f"""#!{PYTHON}
import json, pathlib, sys, time
here = pathlib.Path(__file__).parent
mode = (here / "discovery_mode").read_text().strip()
if mode == "fail":
    sys.exit("chaos: discovery fails on purpose")
if mode == "hang":
    time.sleep(60)
for host, slots in json.loads((here / "hosts.json").read_text()).items():
    print(f"{{host}}:{{slots}}")
"""


@dataclass
class ChaosReport:
    seed: int
    injected: list[tuple[float, str, str]] = field(default_factory=list)
    recovered_s: list[float] = field(default_factory=list)  # per fault: until 3 steps later
    # per sigkill_all: the step rank 0 had reported committed just before every worker died
    lost_at_step: list[int] = field(default_factory=list)
    driver_rss_kb: list[int] = field(default_factory=list)
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    records: list[dict] = field(default_factory=list)
    duration_s: float = 0.0

    def counts(self) -> Counter[str]:
        return Counter(kind for _, kind, _ in self.injected)

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.counts().items()))
        rss = self.driver_rss_kb
        grown = (rss[-1] - rss[0]) / 1024 if len(rss) > 1 else 0.0
        return (f"seed {self.seed}: {len(self.injected)} faults survived ({kinds}) in "
                f"{self.duration_s:.0f}s; driver RSS {rss[0] / 1024 if rss else 0:.1f} -> "
                f"{rss[-1] / 1024 if rss else 0:.1f} MiB ({grown:+.1f} MiB); recovery "
                f"(until 3 more steps), median by kind: {self.recoveries()}")

    def recoveries(self) -> str:
        by_kind: dict[str, list[float]] = {}
        for (_, kind, _), seconds in zip(self.injected, self.recovered_s, strict=False):
            by_kind.setdefault(kind, []).append(seconds)
        return ", ".join(f"{kind} {sorted(times)[len(times) // 2]:.1f}s"
                         for kind, times in sorted(by_kind.items()))


class Chaos:
    def __init__(self, workdir: Path, seed: int, ssh_hosts: list[str],
                 extra_env: dict[str, str] | None = None, hang_detection: bool = True,
                 driver_restarts: bool = False) -> None:
        self.dir = workdir
        # The driver SIGKILLed and resumed (--state-dir, --resume): opt-in, not in CI's soak.
        self.kinds = {**KINDS, **({"driver_restart": 1} if driver_restarts else {})}
        self.state_flags = ["--state-dir", str(workdir / "state")] if driver_restarts else []
        self.hang_flags = [] if hang_detection else WITHOUT_HANG_DETECTION
        self.rng = random.Random(seed)
        self.report = ChaosReport(seed)
        self.all_hosts = {"localhost": 2, "127.0.0.1": 2, "127.0.0.2": 1,
                          **{host: 1 for host in ssh_hosts}}
        self.listed = dict(self.all_hosts)
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True)
        self.progress = workdir / "progress"
        self.stop_file = workdir / "stop"
        self.extra_env = extra_env or {}
        self._planned = sorted(self.kinds, key=lambda _: self.rng.random())
        self._planned.remove("add_host")  # after a removal, so that it can apply
        self._planned.insert(self._planned.index("remove_host"), "add_host")

    # --- the job --------------------------------------------------------------------------
    def start(self, max_restarts: int) -> None:
        self._write_hosts()
        (self.dir / "discovery_mode").write_text("ok")
        script = self.dir / "discover.py"
        script.write_text(DISCOVERY)
        script.chmod(0o755)
        env = {"TRAIN_SAMPLES": "48", "TRAIN_EPOCHS": "100000", "TRAIN_BATCH": "4",
               "TRAIN_STEP_SLEEP": "0.02", "LOG_DIR": str(self.logs),
               "PROGRESS_FILE": str(self.progress), "TRAIN_STOP_FILE": str(self.stop_file),
               **self.extra_env}
        self.started = time.monotonic()
        self.env, self.tag = job_env(env)
        self._out: list[str] = []
        self._err: list[str] = []
        self._drains: list[threading.Thread] = []
        self._driver([
            "-np", "4", "--min-np", str(MIN_NP), "--max-np", "6",
            "--host-discovery-script", str(script), "--discovery-interval", "0.5",
            "--discovery-timeout", "2", *self.hang_flags, "--start-timeout", "60",
            "--blacklist-cooldown-range", "2", "4", "--max-restarts", str(max_restarts),
            *self.state_flags,
            PYTHON, str(SCRIPTS / "elastic_train.py")])

    def _driver(self, args: list[str]) -> None:
        self.proc = subprocess.Popen([PYTHON, "-m", "elasticrun", *args], env=self.env,
                                     cwd=REPO, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Drain the job's output as it comes: a full pipe would block the driver.
        drains = [threading.Thread(target=_drain, args=(stream, sink), daemon=True)
                  for stream, sink in ((self.proc.stdout, self._out),
                                       (self.proc.stderr, self._err))]
        for thread in drains:
            thread.start()
        self._drains += drains

    def run(self, faults: int) -> ChaosReport:
        self.start(max_restarts=faults)  # a total loss counts as a restart: room for each
        try:
            self._wait_progress(after=0, steps=3)
            for _ in range(faults):
                step = self._step()
                kind, detail = self._inject()
                injected = time.monotonic()
                self.report.injected.append((injected - self.started, kind, detail))
                self._wait_progress(after=step, steps=3)
                if kind == "driver_restart":  # training goes on without it: wait for it too
                    self._wait_resumed()
                self.report.recovered_s.append(time.monotonic() - injected)
                self.report.driver_rss_kb.append(_rss_kb(self.proc.pid))
            self.listed = dict(self.all_hosts)  # end healthy: every host, discovery working
            self._write_hosts()
            (self.dir / "discovery_mode").write_text("ok")
            self.stop_file.touch()
            self.proc.wait(timeout=RECOVERY_TIMEOUT_S)
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            self._collect_output()
            raise
        self.report.returncode = self.proc.returncode
        self._collect_output()
        self.report.duration_s = time.monotonic() - self.started
        self.report.records = list(read_records(self.logs))
        return self.report

    def driver_tail(self, lines: int = 12) -> str:
        """The driver's own last lines (not its workers' forwarded output, "[rank]<stream>:
        ..."): why it stopped, a traceback included."""
        said = [line for line in list(self._err) if not WORKER_LINE.match(line)]
        return "".join(said[-lines:])

    def _collect_output(self) -> None:
        for thread in self._drains:
            thread.join(10)
        self.report.stdout, self.report.stderr = "".join(self._out), "".join(self._err)

    # --- faults ---------------------------------------------------------------------------
    def _inject(self) -> tuple[str, str]:
        """The first faults are every kind once, in a seeded order; then weighted draws.
        A kind that cannot apply now (no host to add back, ...) is replaced by a draw."""
        while True:
            if self._planned:
                kind = self._planned.pop()
            else:
                kind = self.rng.choices(list(self.kinds), weights=list(self.kinds.values()))[0]
            detail = getattr(self, f"_{kind}")()
            if detail is not None:
                return kind, detail

    def _driver_restart(self) -> str:
        """The driver SIGKILLed; a little later `elasticrun --resume --state-dir DIR`."""
        old = self.proc
        old.kill()
        old.wait()
        away = self.rng.uniform(0.2, 2.0)
        time.sleep(away)
        self._driver(["--resume", *self.state_flags])
        return f"pid {old.pid}, away {away:.1f}s"

    def _sigkill(self) -> str | None:
        pid = self._victim()
        if pid is None:
            return None
        os.kill(pid, signal.SIGKILL)
        return f"pid {pid}"

    def _exception(self) -> str | None:
        pid = self._victim()
        if pid is None:
            return None
        (self.logs / f"raise-{pid}").touch()
        return f"pid {pid}"

    def _sigkill_all(self) -> str | None:
        """Every worker of the job SIGKILLed at once, the latest round's and any started
        since: no live worker holds the commit, and the driver restarts from a snapshot."""
        if not any(_alive(r["pid"]) for r in self._latest_round()):
            return None
        step = self._step()
        pids = self._workers()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        self.report.lost_at_step.append(step)
        return f"{len(pids)} workers at step {step}"

    def _sigstop(self) -> str | None:
        pid = self._victim()
        if pid is None:
            return None
        os.kill(pid, signal.SIGSTOP)  # the driver kills it once its round gives up on it
        return f"pid {pid}"

    def _remove_host(self) -> str | None:
        candidates = [h for h in self.listed
                      if sum(s for k, s in self.listed.items() if k != h) >= MIN_NP + 1]
        if not candidates:
            return None
        host = self.rng.choice(sorted(candidates))
        del self.listed[host]
        self._write_hosts()
        return host

    def _add_host(self) -> str | None:
        missing = sorted(set(self.all_hosts) - set(self.listed))
        if not missing:
            return None
        host = self.rng.choice(missing)
        self.listed[host] = self.all_hosts[host]
        self._write_hosts()
        return host

    def _discovery_fails(self) -> str:
        return self._discovery_mode("fail")

    def _discovery_hangs(self) -> str:
        return self._discovery_mode("hang")

    def _discovery_mode(self, mode: str) -> str:
        seconds = self.rng.uniform(1.5, 4.0)
        (self.dir / "discovery_mode").write_text(mode)
        time.sleep(seconds)
        (self.dir / "discovery_mode").write_text("ok")
        return f"{seconds:.1f}s"

    def _victim(self) -> int | None:
        """A running worker of the latest round (from the training records), unless all of
        that round runs on one host: losing a worker loses its host, and losing every
        worker that holds the state is a total loss, a fault of its own (sigkill_all)."""
        members = self._latest_round()
        if len({r["host"] for r in members}) < 2:
            return None
        alive = [pid for pid in sorted({r["pid"] for r in members}) if _alive(pid)]
        return self.rng.choice(alive) if alive else None

    def _latest_round(self) -> list[dict]:
        """The "round" records of the latest round (none before the first)."""
        rounds = [r for r in read_records(self.logs) if r["event"] == "round"]
        latest = max((r["round"] for r in rounds), default=None)
        return [r for r in rounds if r["round"] == latest]

    def _workers(self) -> list[int]:
        """Every worker process of the job still there, a stopped one too; the tag, since
        the pid of a worker long gone may be another process's now."""
        started = {r["pid"] for r in read_records(self.logs) if r["event"] == "start"}
        return [pid for pid in sorted(started) if _state(pid) in ("R", "S", "D", "T", "t")
                and env_of(pid).get(TAG_VAR) == self.tag]

    # --- helpers ----------------------------------------------------------------------------
    def _write_hosts(self) -> None:
        tmp = self.dir / "hosts.json.tmp"
        tmp.write_text(json.dumps(self.listed))
        tmp.replace(self.dir / "hosts.json")

    def _step(self) -> int:
        try:
            return int(json.loads(self.progress.read_text())[0])
        except (OSError, ValueError):
            return 0

    def _wait_resumed(self) -> None:
        """Until the resumed driver says who came back (its memory is measured next)."""
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        said = sum("re-adopted" in line for line in list(self._err))
        while said < self.report.counts()["driver_restart"]:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the resumed driver did not take its workers back; its "
                                     f"last lines:\n{self.driver_tail()}")
            time.sleep(0.05)
            said = sum("re-adopted" in line for line in list(self._err))

    def _wait_progress(self, after: int, steps: int) -> None:
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while self._step() < after + steps:
            if self.proc.poll() is not None:
                self._collect_output()
                raise AssertionError(
                    f"the job ended during chaos ({self.proc.returncode}); the last faults: "
                    f"{self.report.injected[-3:]}; the driver's last lines:\n"
                    f"{self.driver_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no progress for {RECOVERY_TIMEOUT_S:g}s after "
                                     f"{self.report.injected[-1:]}")
            time.sleep(0.05)


def _drain(stream: IO[str] | None, sink: list[str]) -> None:
    if stream is not None:
        for line in stream:
            sink.append(line)


def _alive(pid: int) -> bool:
    return _state(pid) in ("R", "S", "D")


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def final_epoch(records: list[dict]) -> int:
    epochs = {r["epoch"] for r in records if r["event"] == "final"}
    assert len(epochs) == 1, f"ranks ended in different epochs: {epochs}"
    return epochs.pop()

