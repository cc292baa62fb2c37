"""Shared by the benchmarks: running jobs, reading their timestamped events, tables.

Every benchmark module defines `bench(trials: int, quick: bool) -> dict` that prints its
table and returns JSON-serialisable raw numbers (run.py writes them to results/).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SCRIPTS = HERE / "scripts"
RESULTS = HERE / "results"
PYTHON = sys.executable
TAG_VAR = "ELASTICRUN_BENCH_TAG"
# torchrun's agents share their rendezvous TCPStore with the workers by default, and
# restarted workers then read the previous attempt's Gloo addresses (pytorch/pytorch#135712):
# restarts fail or hang. The documented way out is to turn the sharing off.
TORCHRUN_WORKAROUND = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def bench_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a benchmark job: the repo importable, one intra-op thread per
    worker (several workers share this machine's cores)."""
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            **(extra or {})}


def elasticrun_command(args: Sequence[str], script: Path | str) -> list[str]:
    return [PYTHON, "-m", "elasticrun", "--start-timeout", "120", *args, PYTHON, str(script)]


def read_events(*paths: Path) -> list[dict[str, Any]]:
    """JSON lines from each existing file, sorted by their "time"."""
    events = []
    for path in paths:
        if path.exists():
            events += [json.loads(line) for line in path.read_text().splitlines() if line]
    return sorted(events, key=lambda e: e["time"])


class Tail:
    """The JSON lines a file gains, read as they come (the file may not exist yet)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as file:
            file.seek(self._offset)
            chunk = file.read()
        end = chunk.rfind(b"\n") + 1  # a line still being written waits for the next read
        self._offset += end
        return [json.loads(line) for line in chunk[:end].splitlines() if line]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


class ByLauncher:
    """Trials by launcher (`trials`), for a benchmark's results class to inherit: a trial
    holding "error" did not run to its end and is left out of every figure."""

    trials: dict[str, list[dict[str, Any]]]

    def ok(self, launcher: str) -> list[dict[str, Any]]:
        return [t for t in self.trials.get(launcher, []) if "error" not in t]

    def stat(self, launcher: str, key: str, how: Callable[[list[float]], float] = median
             ) -> float:
        return how([t[key] for t in self.ok(launcher)])

    def spread(self, launcher: str, keys: Iterable[str]) -> dict[str, dict[str, float]]:
        """Median, min and max of each key over the launcher's finished trials."""
        return {k: {"median": self.stat(launcher, k), "min": self.stat(launcher, k, min),
                    "max": self.stat(launcher, k, max)} for k in keys}

    def span(self, launcher: str, key: str) -> str:
        """The key's range over the launcher's finished trials: "min-max"."""
        return f"{self.stat(launcher, key, min):.3f}-{self.stat(launcher, key, max):.3f}"

    def endings(self, launcher: str) -> str:
        """How the finished trials' jobs ended (their "exit"): "3 ok", "2 ok, 1 hung", ..."""
        counts: dict[str, int] = {}
        for t in self.ok(launcher):
            counts[t["exit"]] = counts.get(t["exit"], 0) + 1
        return ", ".join(f"{n} {how}"
                         for how, n in sorted(counts.items(), key=lambda c: c[0] != "ok"))

    def failures(self, launcher: str) -> str:
        """The launcher's trials that did not run to their end: "N failed: <the first's
        error>", or ""."""
        failed = [t["error"] for t in self.trials.get(launcher, []) if "error" in t]
        return f"{len(failed)} failed: {failed[0][:80]}" if failed else ""

    def collect(self, trials: int, launchers: Sequence[str],
                trial: Callable[[str, Path], dict[str, Any]]) -> None:
        """`trials` rounds of one trial per launcher, each in a temporary directory of its
        own, interleaved so that drift of the machine hits every launcher. A failure under
        elasticrun fails the benchmark; a peer's is a result too (a trial holding "error")."""
        for _ in range(trials):
            for launcher in launchers:
                with tempfile.TemporaryDirectory() as tmp:
                    try:
                        self.trials[launcher].append(trial(launcher, Path(tmp)))
                    except RuntimeError as exc:
                        if launcher == "elasticrun":
                            raise
                        self.trials[launcher].append({"error": str(exc)})


def summarize(trials: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The median of every numeric key over trials."""
    keys = [k for k, v in trials[0].items() if isinstance(v, (int, float))]
    return {key: median(t[key] for t in trials) for key in keys}


def print_table(title: str, headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    print(f"\n{title}")
    print("  " + "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
    for row in cells:
        print("  " + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    sys.stdout.flush()


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def torchrun_command(script: Path | str, nproc: int, *, nnodes: str = "1", port: int = 0,
                     is_host: bool = True, rdzv_conf: str = "",
                     extra: Sequence[str] = ()) -> list[str]:
    """One torchrun agent (c10d rendezvous on 127.0.0.1:port, defaults otherwise)."""
    conf = ",".join(filter(None, [f"is_host={int(is_host)}", rdzv_conf]))
    return [PYTHON, "-m", "torch.distributed.run", "--nnodes", nnodes,
            "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "bench",
            "--rdzv-conf", conf, *extra, str(script)]


class Jobs:
    """Processes started in their own sessions, tagged through their environment; every
    process carrying the tag (torchrun's workers too, which leave the agent's session) is
    gone when the block ends."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.logs: list[IO[str]] = []  # files, not pipes: nobody has to keep reading them
        self.tag = uuid.uuid4().hex

    def start(self, command: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[str]:
        log = tempfile.TemporaryFile("w+")
        proc = subprocess.Popen(list(command), env={**env, TAG_VAR: self.tag},
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, text=True,
                                start_new_session=True)
        self.procs.append(proc)
        self.logs.append(log)
        return proc

    def wait(self, timeout: float, what: str, progress: Path | None = None,
             stall_s: float = 60.0) -> None:
        """Waits for every process; fails unless each exits 0 within `timeout` seconds, or
        (with `progress`, a file the job appends to) when the file stops growing for
        `stall_s` seconds: a hung job is reported as such, not waited out."""
        deadline = time.monotonic() + timeout
        last_size, last_change = -1, time.monotonic()
        while any(proc.poll() is None for proc in self.procs):
            now = time.monotonic()
            if now > deadline:
                raise RuntimeError(f"{what} did not finish within {timeout:g}s")
            size = progress.stat().st_size if progress and progress.exists() else 0
            if size != last_size:
                last_size, last_change = size, now
            elif progress and now - last_change > stall_s:
                raise RuntimeError(f"{what} hung: no progress for {stall_s:g}s")
            time.sleep(0.2)
        for proc in self.procs:
            if proc.returncode != 0:
                raise RuntimeError(f"{what} failed (exit {proc.returncode}): "
                                   f"{self.error_line(proc)}")

    def error_line(self, proc: subprocess.Popen[str], marker: str = "Error") -> str:
        """The last line of the process's output that holds `marker` (else its last line);
        the process has exited (its log is read from the start)."""
        log = self.logs[self.procs.index(proc)]
        log.seek(0)
        lines = [line for line in log.read().splitlines() if line.strip()]
        errors = [line for line in lines if marker in line] or lines
        return errors[-1].strip()[:300] if errors else ""

    def __enter__(self) -> Jobs:
        return self

    def __exit__(self, *exc: object) -> None:
        # SIGTERM first: torchrun and elasticrun then stop the workers they started.
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        kill_tagged(self.tag)
        for proc in self.procs:
            proc.wait()
        for log in self.logs:
            log.close()


def kill_tagged(tag: str) -> None:
    """SIGKILLs every process that carries the benchmark tag `tag` in its environment."""
    for pid in tagged_pids(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def cpu_s(pid: int) -> float:
    """A process's user + system CPU seconds so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tagged_pids(tag: str) -> list[int]:
    needle = f"{TAG_VAR}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def survivors(tag: str, timeout: float = 10.0) -> list[int]:
    """The processes still carrying the benchmark tag `tag` after `timeout` seconds of
    SIGKILLing them (a killed process may take a moment to go)."""
    deadline = time.monotonic() + timeout
    while (left := tagged_pids(tag)) and time.monotonic() < deadline:
        kill_tagged(tag)
        time.sleep(0.1)
    return left
