"""Control-plane security, end to end: where the driver listens, and where the secret is not."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.request
from pathlib import Path

from tests.integration.harness import (
    PYTHON,
    SCRIPTS,
    assert_no_orphans,
    free_port,
    read_records,
    start_job,
    tagged_pids,
    write_script,
)

SLEEPY = [PYTHON, str(SCRIPTS / "sleepy_train.py")]


def listening_on(port: int) -> set[str]:
    """Addresses with a socket listening on `port` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].split(":")
            if fields[3] != "0A" or int(port_hex, 16) != port:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(address)
            if width == 8:
                found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
            else:
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


def wait_until(check, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def stop(proc, tag: str) -> str:  # type: ignore[no-untyped-def]
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    assert_no_orphans(tag)
    return err


def test_driver_listens_only_where_it_must(tmp_path: Path) -> None:
    """A job whose hosts come from a script may grow to other machines, so it does not
    listen on loopback only; still, it listens on the addresses hosts dial, not on all."""
    script = write_script(tmp_path / "hosts.sh", "echo localhost:2\n")
    port = free_port()
    proc, tag = start_job(["-np", "2", "--host-discovery-script", str(script),
                           "--port", str(port), *SLEEPY])
    wait_until(lambda: bool(listening_on(port)))
    addresses = listening_on(port)
    assert "127.0.0.1" in addresses
    assert not addresses & {"0.0.0.0", "::"}, addresses
    err = stop(proc, tag)
    assert "all interfaces" not in err


def test_bind_to_all_interfaces_is_warned_about() -> None:
    port = free_port()
    proc, tag = start_job(["-np", "1", "--bind", "0.0.0.0", "--port", str(port), *SLEEPY])
    wait_until(lambda: bool(listening_on(port)))
    assert listening_on(port) == {"0.0.0.0"}
    err = stop(proc, tag)
    assert f"warning: the driver listens on all interfaces (0.0.0.0:{port})" in err


def test_bind_must_be_an_address() -> None:
    proc, tag = start_job(["-np", "1", "--bind", "not-an-ip", "true"])
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.strip() == ("elasticrun: error: --bind 'not-an-ip': expected an IP address "
                           "of this machine (or 0.0.0.0 for all interfaces)")
    assert_no_orphans(tag)


def test_secret_is_in_no_log_line_event_status_or_command_line(tmp_path: Path) -> None:
    """At DEBUG, through a failure and a new round, with events and /status."""
    # one worker a host: each is exec'd (below), so each imports torch itself
    script = write_script(tmp_path / "hosts.sh", "echo localhost:1\necho 127.0.0.1:1\n")
    port = free_port()
    events = tmp_path / "events.jsonl"
    logs = tmp_path / "logs"
    logs.mkdir()
    train_env = {"TRAIN_SAMPLES": "64", "TRAIN_EPOCHS": "1000", "TRAIN_STEP_SLEEP": "0.05",
                 "LOG_DIR": str(logs)}
    proc, tag = start_job(["-np", "2", "--min-np", "1", "-v", "--host-discovery-script",
                           str(script), "--port", str(port), "--event-log", str(events),
                           # -u: exec'd, not forked from a template (this test reads the
                           # secret from the workers' /proc/PID/environ)
                           PYTHON, "-u", str(SCRIPTS / "elastic_train.py")], train_env)
    secret = None
    cmdlines = []
    deadline = time.monotonic() + 60
    while secret is None:
        assert time.monotonic() < deadline, "no worker started"
        for pid in set(tagged_pids(tag)) - {proc.pid}:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmdlines.append(Path(f"/proc/{pid}/cmdline").read_bytes())
            except OSError:
                continue
            for entry in environ:
                if entry.startswith(b"ELASTICRUN_SECRET="):
                    secret = entry.split(b"=", 1)[1].decode()
        time.sleep(0.05)
    assert len(secret) >= 32
    wait_until(lambda: any(r["event"] == "step" for r in read_records(logs)))
    # One worker fails: the driver logs, blacklists and opens round 2.
    victims = [pid for pid in tagged_pids(tag) if b"ELASTICRUN_HOSTNAME=127.0.0.1" in
               Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")]
    assert victims
    os.kill(victims[0], signal.SIGKILL)
    wait_until(lambda: _status(port).get("round") == 2 and _status(port)["round_complete"])
    status = json.dumps(_status(port))
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    cmdlines.append(Path(f"/proc/{proc.pid}/cmdline").read_bytes())
    err = stop(proc, tag)
    assert "round 2" in err and "elasticrun: debug: " in err  # it really logged at debug level
    for where, text in (("log", err), ("events", events.read_text()), ("status", status),
                        ("metrics", metrics.decode()),
                        *(("command line", c.decode(errors="replace")) for c in cmdlines)):
        assert secret not in text, f"the job secret appears in the {where}"


def _status(port: int) -> dict:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as reply:
            return json.loads(reply.read())
    except OSError:
        return {}
