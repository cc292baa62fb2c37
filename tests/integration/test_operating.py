"""Operating a job: a discovery plugin, the host-change webhook, events, /status, /metrics."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from elasticrun.driver.operate.sinks import verify_event
from tests.integration.harness import (
    PYTHON,
    REPO,
    SCRIPTS,
    JobResult,
    assert_no_orphans,
    free_port,
    read_records,
    start_job,
)
from tests.integration.progress import check_job, read_progress

TRAIN = [PYTHON, str(SCRIPTS / "elastic_train.py")]
TOKEN = "test-token-0123456789abcdef"


def train_env(log_dir: Path, progress: Path, samples: int = 64, epochs: int = 3,
              sleep: float = 0.0, faults: str = "", slow_below: int = 0,
              stop_file: Path | None = None) -> dict[str, str]:
    """A scenario of several phases gives a stop file and many epochs, and touches the file
    when done: a loaded machine does not end the job early."""
    log_dir.mkdir(parents=True, exist_ok=True)
    return {"TRAIN_SAMPLES": str(samples), "TRAIN_EPOCHS": str(epochs), "TRAIN_BATCH": "4",
            "TRAIN_STEP_SLEEP": str(sleep), "FAULTS": faults, "TRAIN_SLOW_BELOW": str(slow_below),
            "LOG_DIR": str(log_dir), "PROGRESS_FILE": str(progress),
            **({"TRAIN_STOP_FILE": str(stop_file)} if stop_file else {})}


class Job:
    """A running `elasticrun` job that the test talks to while it trains."""

    def __init__(self, args: list[str], env: dict[str, str], log_dir: Path,
                 progress: Path, cwd: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_dir = log_dir
        self.progress = progress
        self.proc, self.tag = start_job(["--port", str(self.port), *args], env, cwd)

    def step(self) -> tuple[int, int]:
        return read_progress(self.progress)

    def wait_until(self, what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self._holds(check):
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                raise AssertionError(f"job ended while waiting for {what}:\n{out}\n{err}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.05)

    @staticmethod
    def _holds(check: Callable[[], bool]) -> bool:
        try:
            return check()
        except (urllib.error.URLError, ConnectionError):  # the driver is not serving yet
            return False

    def request(self, method: str, path: str, body: Any = None,
                token: str | None = TOKEN) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def status(self) -> dict[str, Any]:
        code, status = self.request("GET", "/status", token=None)
        assert code == 200
        return status

    def host_states(self) -> dict[str, str]:
        return {h["host"]: h["state"] for h in self.status()["hosts"]}

    def finish(self, timeout: float = 120.0) -> JobResult:
        started = time.monotonic()
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            assert_no_orphans(self.tag, within=0)
            raise AssertionError(f"job did not finish:\n{out}\n{err}") from None
        result = JobResult(self.proc.returncode, out, err, time.monotonic() - started,
                           time.time(), self.tag, self.log_dir)
        assert_no_orphans(self.tag)
        result.records = list(read_records(self.log_dir))
        assert result.returncode == 0, f"job failed:\n{out[-3000:]}\n{err[-3000:]}"
        return result


def read_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_no_rollback(result: JobResult) -> None:
    """Nobody restored a commit, and no worker ever went back to a step it had done."""
    assert not result.events("restore"), result.events("restore")
    by_pid: dict[int, list[int]] = {}
    for record in result.events("step"):
        by_pid.setdefault(record["pid"], []).append(record["step"])
    for pid, steps in by_pid.items():
        assert steps == sorted(set(steps)), f"worker {pid} repeated steps: {steps}"


# --- discovery plugin -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/plugins/dirhosts installed with pip into a directory of its own."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [PYTHON, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(REPO / "tests" / "plugins" / "dirhosts")],
        check=True, capture_output=True, timeout=120)
    return target


def test_plugin_found_by_name_drives_add_and_remove(tmp_path: Path, plugin_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.mkdir()
    (hosts / "localhost").write_text("2")
    stop = tmp_path / "stop"
    env = train_env(tmp_path / "logs", tmp_path / "progress", epochs=1000, sleep=0.05,
                    stop_file=stop)
    env["PYTHONPATH"] = str(plugin_path)
    job = Job(["-np", "2", "--discovery", f"dirhosts:{hosts}", "--discovery-interval", "0.2",
               "--start-timeout", "60", *TRAIN], env, tmp_path / "logs", tmp_path / "progress")
    job.wait_until("step 3", lambda: job.step()[0] >= 3)
    (hosts / "127.0.0.1").write_text("2")
    job.wait_until("world size 4", lambda: job.step()[1] == 4)
    (hosts / "localhost").unlink()
    job.wait_until("world size 2", lambda: job.step()[1] == 2 and
                   set(job.host_states()) == {"127.0.0.1"})
    assert job.status()["discovery"]["source"] == f"dirhosts {hosts}"
    stop.touch()
    result = job.finish()
    views = check_job(result.records, samples=64, epochs=None)
    assert [v.size for v in views] == [2, 4, 2]
    assert set(views[-1].hosts_by_rank.values()) == {"127.0.0.1"}
    assert_no_rollback(result)


def test_unknown_plugin_is_one_line(tmp_path: Path) -> None:
    proc, tag = start_job(["-np", "1", "--discovery", "nosuchplugin:x", "true"])
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.strip().splitlines() == [
        "elasticrun: error: --discovery: no discovery plugin named 'nosuchplugin' "
        "(installed: agents, hostfile, script, slurm, static, webhook)"]
    assert_no_orphans(tag)


# --- host-change webhook ----------------------------------------------------------------------

def webhook_job(tmp_path: Path, discovery: list[str], **train: Any) -> Job:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    env = train_env(tmp_path / "logs", tmp_path / "progress", **train)
    return Job(["-np", "2", "--min-np", "2", *discovery, "--webhook-token-file", str(token_file),
                "--event-log", str(tmp_path / "events.jsonl"), "--start-timeout", "60", *TRAIN],
               env, tmp_path / "logs", tmp_path / "progress")


def test_webhook_push_replaces_hosts_at_once(tmp_path: Path) -> None:
    # A discovery interval far longer than the test: only the push can change anything.
    job = webhook_job(tmp_path, ["--discovery", "webhook:localhost:2",
                                 "--discovery-interval", "300"], epochs=6, slow_below=99)
    job.wait_until("step 3", lambda: job.step()[0] >= 3)

    # Without the token (or with a wrong one): 401, and nothing changes.
    new_hosts = {"hosts": {"127.0.0.1": 2}}
    assert job.request("PUT", "/v1/hosts", new_hosts, token=None)[0] == 401
    assert job.request("PUT", "/v1/hosts", new_hosts, token=TOKEN + "x")[0] == 401
    assert job.request("POST", "/v1/hosts/drain", {"hosts": ["localhost"]}, token=None)[0] == 401
    assert job.host_states() == {"localhost": "active"}
    assert job.request("GET", "/v1/hosts", token=None)[0] == 401

    pushed_at = time.time()
    code, reply = job.request("PUT", "/v1/hosts", new_hosts)
    assert code == 200, reply
    # Acted on within a second, with no poll in between: the new host's workers are
    # starting and the old host is on its way out.
    job.wait_until("the push to take effect", lambda: job.host_states() == {
        "127.0.0.1": "starting", "localhost": "leaving"}, timeout=1.0)
    events = read_events(tmp_path / "events.jsonl")
    changes = {(e["type"], e["data"]["host"]): e["time"] for e in events
               if e["type"] in ("host_added", "host_removed")}
    assert set(changes) == {("host_added", "127.0.0.1"), ("host_removed", "localhost")}
    assert max(changes.values()) - pushed_at < 1.0

    job.wait_until("the new round", lambda: job.host_states() == {"127.0.0.1": "active"})
    result = job.finish()
    views = check_job(result.records, samples=64, epochs=6)
    # Every host was replaced: one worker of the old host stays for one round, as rank 0,
    # to hand the committed state over; then it goes.
    assert [v.size for v in views] == [2, 3, 2]
    assert views[1].hosts_by_rank == {0: "localhost", 1: "127.0.0.1", 2: "127.0.0.1"}
    assert set(views[2].hosts_by_rank.values()) == {"127.0.0.1"}
    assert views[1].resume_step >= 3 and views[2].resume_step >= views[1].resume_step
    assert_no_rollback(result)


def test_drain_removes_a_host_without_rollback(tmp_path: Path) -> None:
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho localhost:2\necho 127.0.0.1:2\n")
    script.chmod(0o755)
    job = webhook_job(tmp_path, ["-np", "4", "--host-discovery-script", str(script),
                                 "--discovery-interval", "0.2"], epochs=4, sleep=0.05)
    job.wait_until("step 3 at world size 4", lambda: job.step() >= (3, 4))
    # Pushing a host list is refused: the hosts come from the script. Draining works.
    code, reply = job.request("POST", "/v1/hosts/add", {"hosts": ["127.0.0.2:1"]})
    assert code == 409 and "discovery script" in reply["error"]
    code, reply = job.request("POST", "/v1/hosts/drain", {"hosts": ["127.0.0.1", "nosuchhost"]})
    assert code == 200 and reply == {"drained": ["127.0.0.1"], "unknown": ["nosuchhost"]}
    job.wait_until("world size 2", lambda: job.step()[1] == 2)
    # The script still lists the drained host; it stays out.
    time.sleep(1.0)
    assert job.host_states() == {"localhost": "active", "127.0.0.1": "drained"}
    result = job.finish()
    views = check_job(result.records, samples=64, epochs=4)
    assert [v.size for v in views] == [4, 2]
    assert set(views[1].hosts_by_rank.values()) == {"localhost"}
    assert_no_rollback(result)
    kinds = [e["type"] for e in read_events(tmp_path / "events.jsonl")]
    assert "host_drained" in kinds and "worker_failed" not in kinds


# --- outbound events ----------------------------------------------------------------------------

class Receiver:
    """A real aiohttp server in a thread that records the events POSTed to it."""

    def __init__(self, hang: bool = False) -> None:
        self.hang = hang
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.port = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Receiver:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        runner = self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = runner.addresses[0][1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.received.append((dict(request.headers), body))
        if self.hang:
            await asyncio.sleep(3600)
        return web.Response(text="ok")


@pytest.fixture
def event_key(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "event-key"
    path.write_text("event-signing-key\n")
    yield path


def failing_job(tmp_path: Path, extra: list[str], sleep: float = 0.0,
                stop_file: Path | None = None) -> Job:
    """Rank 1 (localhost[1]) is killed at step 5, and every new worker in its slot fails at
    its start (a dead GPU): the other three go on at once (--min-np 2), and after two such
    failures more the slot is blacklisted (for longer than the job)."""
    env = train_env(tmp_path / "logs", tmp_path / "progress", faults="5:1:sigkill", sleep=sleep,
                    slow_below=4, **({"epochs": 1000, "stop_file": stop_file} if stop_file
                                     else {"epochs": 6}))
    return Job(["-H", "localhost:2,127.0.0.1:2", "--min-np", "2", "--start-timeout", "60",
                "--event-log", str(tmp_path / "events.jsonl"), *extra, *TRAIN],
               {**env, "TRAIN_FAIL_AT_START": "localhost[1]:1000"}, tmp_path / "logs",
               tmp_path / "progress")


EXPECTED_EVENTS = ["job_started", "round_started", "worker_failed", "round_started",
                   "worker_failed", "worker_failed", "slot_blacklisted", "job_finished"]


def test_signed_events_for_a_job_with_one_failure(tmp_path: Path, event_key: Path) -> None:
    with Receiver() as receiver:
        job = failing_job(tmp_path, ["--event-webhook", f"http://127.0.0.1:{receiver.port}/hook",
                                     "--event-secret-file", str(event_key)])
        job.finish()
        received = list(receiver.received)
    events = []
    for headers, body in received:
        assert verify_event(b"event-signing-key", headers, body, time.time()), headers
        assert not verify_event(b"another-key", headers, body, time.time())
        events.append(json.loads(body))
    assert [e["type"] for e in events] == EXPECTED_EVENTS
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert len({e["job_id"] for e in events}) == 1
    started, round1, failed, round2, *refills, blacklisted, finished = events
    assert round1["data"]["world_size"] == 4 and round2["data"]["world_size"] == 3
    assert round2["data"]["hosts"] == {"localhost": 1, "127.0.0.1": 2}
    assert [m["rank"] for m in round2["data"]["members"]] == [0, 1, 2]
    assert failed["data"]["host"] == "localhost" and failed["data"]["rank"] == 1
    assert "SIGKILL" in failed["data"]["cause"] and failed["data"]["kind"] == "signal"
    assert [(r["data"]["host"], r["data"]["kind"]) for r in refills] == [
        ("localhost", "exit_code")] * 2
    assert (blacklisted["data"]["host"], blacklisted["data"]["slot"]) == ("localhost", 1)
    assert blacklisted["data"]["failures"] == 1 and blacklisted["data"]["cooldown_s"] >= 20
    assert finished["data"]["resets"] == 1
    # The event log has the same events, in the same order.
    logged = read_events(tmp_path / "events.jsonl")
    assert [e["seq"] for e in logged] == [e["seq"] for e in events]
    assert logged == events


def test_a_receiver_that_hangs_or_is_down_does_not_hold_up_the_job(
        tmp_path: Path, event_key: Path) -> None:
    down = free_port()  # nothing listens there
    with Receiver(hang=True) as hanging:
        job = failing_job(tmp_path, [
            "--event-webhook", f"http://127.0.0.1:{hanging.port}/hook",
            "--event-webhook", f"http://127.0.0.1:{down}/hook",
            "--event-secret-file", str(event_key)])
        result = job.finish()
        # It got the first events (each tried again after its 5 s timeout), in order, and
        # the job did not wait for it.
        got = [headers["X-Elasticrun-Event"] for headers, _ in hanging.received]
        assert got and list(dict.fromkeys(got)) == EXPECTED_EVENTS[:len(set(got))]
    check_job(result.records, samples=64, epochs=6)
    logged = read_events(tmp_path / "events.jsonl")
    assert [e["type"] for e in logged] == EXPECTED_EVENTS
    # The driver exits within the bounded flush (2 s) after the job finished.
    assert result.ended_at - logged[-1]["time"] < 4.0
    assert "not delivered" in result.stderr or "dropped" in result.stderr


# --- /status, /metrics, `elasticrun status` ---------------------------------------------

def metric_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _second_round_complete(status: dict[str, object]) -> bool:
    return status["round"] == 2 and status["state"] == "running" \
        and status["round_complete"] is True


def test_metrics_and_status_match_what_happened(tmp_path: Path) -> None:
    # trains until told: `elasticrun status` below starts a Python of its own, seconds on a
    # loaded machine, and must find the job still running (it once found it gone)
    stop = tmp_path / "stop"
    job = failing_job(tmp_path, [], sleep=0.15, stop_file=stop)
    # complete: every member has joined, so the round's rendezvous time is recorded
    job.wait_until("the second round, complete, and the slot blacklisted",
                   lambda: _second_round_complete(status := job.status())
                   and bool(status["blacklisted_slots"]), timeout=90)
    with urllib.request.urlopen(job.url + "/metrics", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        samples = metric_samples(response.read().decode())
    assert samples[("elasticrun_rounds_total", ())] == 2
    assert samples[("elasticrun_resets_total", ())] == 1
    assert samples[("elasticrun_worker_failures_total", (("cause", "signal"),))] == 1
    assert samples[("elasticrun_worker_failures_total", (("cause", "exit_code"),))] == 2
    assert samples[("elasticrun_slots_blacklisted_total", ())] == 1
    assert samples[("elasticrun_hosts_blacklisted_total", ())] == 0
    assert samples[("elasticrun_world_size", ())] == 3
    assert samples[("elasticrun_hosts", (("state", "active"),))] == 2
    assert samples[("elasticrun_hosts", (("state", "blacklisted"),))] == 0
    assert samples[("elasticrun_rendezvous_seconds_count", ())] == 2
    assert samples[("elasticrun_recovery_seconds_count", ())] == 1
    assert 0 < samples[("elasticrun_recovery_seconds_sum", ())] < 30
    assert samples[("elasticrun_discovery_seconds_count", ())] >= 1

    status = job.status()
    assert status["world_size"] == 3 and status["resets"] == 1 and status["blacklist"] == []
    assert [(b["host"], b["slot"]) for b in status["blacklisted_slots"]] == [("localhost", 1)]
    assert status["blacklisted_slots"][0]["cooldown_left_s"] > 0  # the default cooldown
    # the URL as the argument (the form the job's start line gives) and as --url
    shown, by_option = (
        subprocess.run([PYTHON, "-m", "elasticrun", "status", *url], capture_output=True,
                       text=True, timeout=30)
        for url in ([job.url], ["--url", job.url]))
    assert shown.returncode == 0, shown.stderr
    assert by_option.returncode == 0, by_option.stderr
    lines = shown.stdout.splitlines()
    # (the first line has the uptime, the cooldown left ticks and the members' pace moves)
    assert _steady(by_option.stdout.splitlines()[1:]) == _steady(lines[1:])
    assert lines[0].startswith(f"job {status['job_id']}: running, round 2, world size 3")
    rows = {line.split()[0]: line.split()[1:] for line in lines if line[:1] not in (" ", "j")}
    assert rows["127.0.0.1"] == ["2", "active", "1,2"]
    assert rows["localhost"] == ["2", "active", "0"]
    assert "blacklisted slots:" in lines and any(
        line.startswith("  localhost[1]  1 time(s), for another ") for line in lines)
    stop.touch()
    result = job.finish()
    # the job's start line gives the command that shows its status
    assert f"status at {job.url}/status (elasticrun status {job.url})" in result.stderr


def test_status_of_no_driver_is_one_line() -> None:
    shown = subprocess.run([PYTHON, "-m", "elasticrun", "status", "--url",
                            f"http://127.0.0.1:{free_port()}", "--timeout", "2"],
                           capture_output=True, text=True, timeout=30)
    assert shown.returncode == 1
    assert len(shown.stderr.splitlines()) == 1
    assert shown.stderr.startswith("elasticrun: error: http://127.0.0.1:")
    assert "cannot reach the driver" in shown.stderr


def test_workers_never_see_the_operator_secrets(tmp_path: Path) -> None:
    """The webhook token and the event key stay with the driver; the job secret reaches
    the workers (which need it), by environment only."""
    show = ("import os; print(sorted(k for k in os.environ if k in ('ELASTICRUN_WEBHOOK_TOKEN', "
            "'ELASTICRUN_EVENT_SECRET', 'ELASTICRUN_SECRET')))")
    proc, tag = start_job(["-np", "1", "--discovery", "webhook:localhost:1", PYTHON, "-c", show],
                          {"ELASTICRUN_WEBHOOK_TOKEN": TOKEN, "ELASTICRUN_EVENT_SECRET": "k" * 20})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == "[0]<stdout>:['ELASTICRUN_SECRET']"
    assert TOKEN not in out + err
    assert_no_orphans(tag)


def _steady(lines: list[str]) -> list[str]:
    """`elasticrun status` lines without what changes from one call to the next."""
    return [line.partition(", for another")[0] for line in lines
            if not line.startswith("stragglers:")]
