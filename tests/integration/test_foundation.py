"""End-to-end tests of the foundation: real `elasticrun` jobs with real worker processes.

Covered: DistributedOptimizer equivalence and worker placement on a two-host list, an
unmodified torchrun-style script, output prefixes and per-rank files, bad input ending as
one error line, SIGINT/SIGTERM stopping the job without orphans, and a failing rank named
as the root cause. A test that exposes a known bug is marked xfail(strict=True), and the mark
is removed once the bug is fixed.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import queue
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
from harness import PYTHON, SCRIPTS, JobResult, assert_no_orphans, run_job, start_job, write_script

from elasticrun.job.config import DriverConfig

pytestmark = pytest.mark.timeout(180)

START = ["--start-timeout", "60"]
# SIGTERM to a worker, then SIGKILL after this long
STOP_GRACE_S: float = next(
    f.default for f in dataclasses.fields(DriverConfig) if f.name == "stop_grace_period")
PREFIXED = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:(.*)$")


# --- helpers -----------------------------------------------------------------------------


def forwarded(text: str, stream: str) -> list[tuple[int, str]]:
    """(rank, line) for every worker line forwarded on `stream`."""
    found = []
    for line in text.splitlines():
        match = PREFIXED.match(line)
        if match and match.group(2) == stream:
            found.append((int(match.group(1)), match.group(3)))
    return found


def error_message(stderr: str) -> str:
    """The driver's error: its `elasticrun: error` line plus the indented lines after it."""
    lines = stderr.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("elasticrun: error")]
    assert len(starts) == 1, f"expected one error line, got {len(starts)}:\n{stderr}"
    message = [lines[starts[0]]]
    for line in lines[starts[0] + 1:]:
        if line.startswith(("elasticrun:", "[")) or not line.startswith(" "):
            break
        message.append(line)
    return "\n".join(message)


def assert_clean_failure(result: JobResult, within: float) -> str:
    """Non-zero exit, exactly one error line, no traceback, finished in time. Returns the error."""
    details = f"rc={result.returncode} after {result.duration:.1f}s\n{result.stderr}"
    assert result.returncode != 0, details
    assert len(result.error_lines()) == 1, details
    assert "Traceback" not in result.stderr, details
    assert result.duration < within, details
    return error_message(result.stderr)


@dataclass
class LiveJob:
    """A running elasticrun whose output is read line by line while it runs."""

    proc: subprocess.Popen[str]
    tag: str
    lines: queue.Queue[tuple[str, str]] = field(default_factory=queue.Queue)
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    readers: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def start(cls, args: list[str]) -> LiveJob:
        proc, tag = start_job(args)
        job = cls(proc, tag)
        for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            assert pipe is not None
            reader = threading.Thread(target=job._read, args=(name, pipe), daemon=True)
            reader.start()
            job.readers.append(reader)
        return job

    def _read(self, name: str, pipe: IO[str]) -> None:
        for line in pipe:
            line = line.rstrip("\n")
            (self.stdout if name == "stdout" else self.stderr).append(line)
            self.lines.put((name, line))

    def wait_for_ranks(self, pattern: str, ranks: set[int], timeout: float) -> None:
        """Waits until every rank in `ranks` printed a stdout line matching `pattern`."""
        deadline = time.monotonic() + timeout
        seen: set[int] = set()
        regex = re.compile(pattern)
        while not ranks <= seen:
            left = deadline - time.monotonic()
            if left <= 0 or (self.proc.poll() is not None and self.lines.empty()):
                self.kill()
                raise AssertionError(f"ranks {sorted(ranks - seen)} never printed {pattern!r}; "
                                     f"rc={self.proc.poll()}\n{self.output()}")
            try:
                name, line = self.lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            match = PREFIXED.match(line)
            if name == "stdout" and match and regex.search(match.group(3)):
                seen.add(int(match.group(1)))

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None (after killing everything) when it took longer."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        for reader in self.readers:
            reader.join(timeout=5)
        return code

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        assert_no_orphans(self.tag, within=0)

    def output(self) -> str:
        return "\n".join(self.stdout) + "\n--- stderr ---\n" + "\n".join(self.stderr)


# --- 1. DistributedOptimizer, placement, environment, prefixes (one 4-worker job) ---------


# the tests reading the job run on one pytest-xdist worker, so that it runs once
ONE_JOB = pytest.mark.xdist_group("optimizer-job")


@pytest.fixture(scope="module")
def optimizer_job() -> JobResult:
    return run_job(["-H", "localhost:2,127.0.0.1:2", *START,
                    PYTHON, str(SCRIPTS / "check_optimizer.py")])


def _by_rank(result: JobResult, head: str) -> dict[int, str]:
    """rank -> the rest of the one stdout line of that rank starting with `head `."""
    found: dict[int, str] = {}
    for rank, line in forwarded(result.stdout, "stdout"):
        if line.startswith(head + " "):
            assert rank not in found, f"rank {rank} printed {head!r} twice"
            found[rank] = line[len(head) + 1:]
    return found


@ONE_JOB
def test_optimizer_job_succeeds(optimizer_job: JobResult) -> None:
    assert optimizer_job.returncode == 0, optimizer_job.stderr
    assert optimizer_job.error_lines() == []


@ONE_JOB
def test_distributed_optimizer_equals_big_batch_sgd(optimizer_job: JobResult) -> None:
    oks = [rank for rank, line in forwarded(optimizer_job.stdout, "stdout")
           if line == "optimizer-equivalence ok"]
    assert sorted(oks) == [0, 1, 2, 3], optimizer_job.stdout + optimizer_job.stderr


@ONE_JOB
def test_parameters_identical_on_every_rank(optimizer_job: JobResult) -> None:
    params = _by_rank(optimizer_job, "params")
    assert sorted(params) == [0, 1, 2, 3], optimizer_job.stdout
    hashes = {}
    for prefix_rank, rest in params.items():
        printed_rank, digest = rest.split()
        assert int(printed_rank) == prefix_rank
        assert re.fullmatch(r"[0-9a-f]{64}", digest), digest
        hashes[prefix_rank] = digest
    assert len(set(hashes.values())) == 1, hashes


@ONE_JOB
def test_ranks_and_environment_follow_host_list(optimizer_job: JobResult) -> None:
    infos = {rank: json.loads(rest) for rank, rest in _by_rank(optimizer_job, "info").items()}
    assert sorted(infos) == [0, 1, 2, 3], optimizer_job.stdout
    expected_host = {0: "localhost", 1: "localhost", 2: "127.0.0.1", 3: "127.0.0.1"}
    masters = set()
    for rank, info in infos.items():
        env: dict[str, Any] = info["env"]
        want = {"rank": rank, "size": 4, "local_rank": rank % 2, "local_size": 2,
                "cross_rank": rank // 2, "cross_size": 2}
        assert {k: info[k] for k in want} == want, info
        assert env["ELASTICRUN_HOSTNAME"] == expected_host[rank], env
        assert env["RANK"] == env["ELASTICRUN_RANK"] == str(rank), env
        assert env["WORLD_SIZE"] == env["ELASTICRUN_SIZE"] == "4", env
        assert env["LOCAL_RANK"] == env["ELASTICRUN_LOCAL_RANK"] == str(rank % 2), env
        assert env["LOCAL_WORLD_SIZE"] == env["ELASTICRUN_LOCAL_SIZE"] == "2", env
        assert env["ELASTICRUN_CROSS_RANK"] == str(rank // 2), env
        assert env["ELASTICRUN_CROSS_SIZE"] == "2", env
        assert env["MASTER_ADDR"], env
        assert env["MASTER_PORT"] and 0 < int(env["MASTER_PORT"]) < 65536, env
        assert env["ELASTICRUN_RENDEZVOUS_ADDR"] and env["ELASTICRUN_RENDEZVOUS_PORT"], env
        # Horovod's names, as horovodrun sets them for an elastic job.
        horovod = {f"HOROVOD_{name.upper()}": str(value) for name, value in want.items()}
        assert {name: env[name] for name in horovod} == horovod, env
        assert env["HOROVOD_HOSTNAME"] == expected_host[rank], env
        assert env["HOROVOD_ELASTIC"] == "1", env
        masters.add((env["MASTER_ADDR"], env["MASTER_PORT"]))
        # Two workers a host and OMP_NUM_THREADS not set: torchrun's default, one intra-op
        # thread each (the forked workers' too: their template imported torch with it).
        assert env["OMP_NUM_THREADS"] == "1" and info["intra_op_threads"] == 1, info
    assert len(masters) == 1, masters  # all ranks agree on rank 0's endpoint
    said = [line for line in optimizer_job.stderr.splitlines() if "OMP_NUM_THREADS" in line]
    assert len(said) == 1 and "OMP_NUM_THREADS=1" in said[0], optimizer_job.stderr


@ONE_JOB
def test_secret_not_on_any_command_line(optimizer_job: JobResult) -> None:
    answers = _by_rank(optimizer_job, "secret-in-cmdline")
    assert answers == {0: "False", 1: "False", 2: "False", 3: "False"}, answers


@ONE_JOB
def test_output_lines_prefixed_with_rank_and_stream(optimizer_job: JobResult) -> None:
    stdout_lines = optimizer_job.stdout.splitlines()
    assert stdout_lines
    for line in stdout_lines:  # the driver writes only worker output to stdout
        assert re.match(r"^\[[0-3]\]<stdout>:", line), line
    for rank in range(4):
        assert f"[{rank}]<stdout>:optimizer-equivalence ok" in stdout_lines
        assert f"[{rank}]<stderr>:stderr-check {rank}" in optimizer_job.stderr.splitlines()
    # a rank's line carries that rank's prefix
    assert "[2]<stdout>:params 2 " in optimizer_job.stdout


# --- 2. an unmodified torchrun-style script ------------------------------------------------


def test_torchrun_style_script_runs_unmodified() -> None:
    result = run_job(["-np", "2", *START, PYTHON, str(SCRIPTS / "torchrun_style.py")])
    assert result.returncode == 0, result.stderr
    reports = {rank: line for rank, line in forwarded(result.stdout, "stdout")
               if line.startswith("torchrun-style")}
    assert reports == {
        0: "torchrun-style rank=0 world=2 sum=1",
        1: "torchrun-style rank=1 world=2 sum=1",
    }, result.stdout + result.stderr


# --- 3. per-rank output files and timestamps ------------------------------------------------


STAMPED = re.compile(
    r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})?) "
    r"\[(\d+)\]<(stdout|stderr)>:(.*)$")


def _check_stamp(stamp: str) -> None:
    when = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    now = (datetime.datetime.now(datetime.UTC) if when.tzinfo
           else datetime.datetime.now())
    assert abs((now - when).total_seconds()) < 300, stamp


def test_output_filename_appends_and_timestamps(tmp_path: Path) -> None:
    out_dir = tmp_path / "logs"
    command = ["sh", "-c", "echo out-$RANK; echo err-$RANK >&2"]
    for _ in range(2):
        result = run_job(["-np", "2", *START, "--output-filename", str(out_dir),
                          "--prefix-output-with-timestamp", *command])
        assert result.returncode == 0, result.stderr
        seen = set()
        for stream, text in (("stdout", result.stdout), ("stderr", result.stderr)):
            for line in text.splitlines():
                if line.startswith("elasticrun:"):
                    continue
                match = STAMPED.match(line)
                assert match, f"not an ISO timestamp + ' [r]<{stream}>:' line: {line!r}"
                stamp, rank, got_stream, body = match.groups()
                _check_stamp(stamp)
                assert got_stream == stream, line
                seen.add(body)
                assert body == f"{'out' if stream == 'stdout' else 'err'}-{rank}", line
        assert seen == {"out-0", "out-1", "err-0", "err-1"}, result.stdout + result.stderr

    for rank in (0, 1):
        stdout = (out_dir / f"rank.{rank}" / "stdout").read_text().splitlines()
        stderr = (out_dir / f"rank.{rank}" / "stderr").read_text().splitlines()
        assert [line for line in stdout if line.endswith(f"out-{rank}")] == stdout, stdout
        assert len(stdout) == 2, f"rank {rank} stdout was not appended to: {stdout}"
        assert len(stderr) == 2 and all(line.endswith(f"err-{rank}") for line in stderr), stderr


# --- 4. bad input: one error line, no traceback, bounded time -------------------------------


def _discovery(tmp_path: Path, body: str, executable: bool = True) -> Path:
    path = write_script(tmp_path / "discover.sh", body)
    if not executable:
        path.chmod(0o644)
    return path


@pytest.mark.parametrize(
    ("case", "body", "extra", "within", "must_mention"),
    [
        ("missing", None, [], 10, ["no such file"]),
        ("not-executable", "echo localhost:2\n", [], 10, ["not executable"]),
        ("exits-nonzero", "echo oops >&2\nexit 7\n", [], 10, [r"\b7\b"]),
        ("hangs", "sleep 100\n", ["--discovery-timeout", "1"], 10, [r"1s|timeout|within"]),
        ("garbage", "echo 'host:abc'\n", [], 10, ["abc"]),
        ("negative-slots", "echo 'host:-2'\n", [], 10, ["-2"]),
        ("too-few-slots", "echo localhost:2\n", ["-np", "3", "--start-timeout", "2"], 15,
         ["slots"]),
    ],
)
def test_bad_discovery_script(tmp_path: Path, case: str, body: str | None, extra: list[str],
                              within: float, must_mention: list[str]) -> None:
    if body is None:
        script = tmp_path / "missing.sh"
    else:
        script = _discovery(tmp_path, body, executable=case != "not-executable")
    args = ["--host-discovery-script", str(script)]
    args += extra if "-np" in extra else ["-np", "2", *START, *extra]
    result = run_job([*args, "true"], timeout=60)
    message = assert_clean_failure(result, within)
    if case != "too-few-slots":  # a script's failure names the script
        assert str(script) in message, message
    for pattern in must_mention:
        assert re.search(pattern, message), f"{pattern!r} not in {message!r}"


def test_more_np_than_static_slots_fails_fast() -> None:
    result = run_job(["-np", "4", "-H", "localhost:2", *START, "true"], timeout=60)
    message = assert_clean_failure(result, within=10)
    assert "slots" in message, message
    assert "4" in message and "2" in message, message


def test_command_not_found() -> None:
    result = run_job(["-np", "2", *START, "no-such-command-xyz"], timeout=60)
    message = assert_clean_failure(result, within=15)
    assert "no-such-command-xyz" in message, message


# --- 5. signals to the driver ---------------------------------------------------------------


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_training_job(sig: signal.Signals, code: int) -> None:
    job = LiveJob.start(["-np", "2", *START, PYTHON, str(SCRIPTS / "sleepy_train.py")])
    job.wait_for_ranks(r"^step \d+$", {0, 1}, timeout=90)
    job.proc.send_signal(sig)
    sent = time.monotonic()
    returncode = job.wait(timeout=15)
    took = time.monotonic() - sent
    assert returncode is not None, f"elasticrun still running 15s after {sig.name}"
    assert returncode == code, f"rc={returncode}\n{job.output()}"
    assert took < 15, took
    assert "Traceback" not in "\n".join(job.stderr), job.output()
    assert_no_orphans(job.tag)


def test_sigterm_kills_worker_that_ignores_it() -> None:
    command = ["sh", "-c", 'trap "" TERM; echo ready; while true; do sleep 0.1; done']
    job = LiveJob.start(["-np", "2", *START, *command])
    job.wait_for_ranks(r"^ready$", {0, 1}, timeout=30)
    job.proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    returncode = job.wait(timeout=STOP_GRACE_S + 10)
    took = time.monotonic() - sent
    assert returncode is not None, "elasticrun did not get rid of a worker ignoring SIGTERM"
    assert returncode == 143, f"rc={returncode}\n{job.output()}"
    assert took < STOP_GRACE_S + 5, took
    assert took > STOP_GRACE_S - 1, f"workers killed after {took:.1f}s, before the grace period"
    assert_no_orphans(job.tag, within=1)


# --- 6. a failing rank is the named root cause ------------------------------------------------


def test_failing_rank_is_reported_and_others_stopped() -> None:
    script = 'if [ "$RANK" = 1 ]; then echo boom-detail >&2; exit 3; fi; sleep 30'
    result = run_job(["-np", "2", *START, "sh", "-c", script], timeout=60)
    message = assert_clean_failure(result, within=15)
    assert re.search(r"\brank 1\b", message), message
    assert "localhost" in message, message
    assert "exited with code 3" in message, message
    # the worker's stderr line, quoted in the error itself (not just forwarded)
    assert "boom-detail" in message, message
