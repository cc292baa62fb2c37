"""10,000 discovered hosts do not hold the driver: its server answers /status within seconds
(before: each host's address scanned every host, ~14-21 s before the server started) and a
SIGTERM right after ends the job."""

from __future__ import annotations

import queue
import re
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO

from tests.integration.harness import PYTHON, assert_no_orphans, start_job, write_script

HOSTS = 10_000
STATUS_WITHIN_S = 8.0  # ~2 s here; before the fix 14-21 s


def _status_url(stream: IO[str], deadline: float) -> str:
    """The status URL the driver prints, read by a thread (a blocked read has no timeout)."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in stream], daemon=True).start()
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if found := re.search(r"status at (http://\S+/status)", line):
            return found.group(1)
    raise AssertionError("no status line before the deadline")


def test_10000_discovered_hosts_do_not_hold_the_server(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("".join(f"127.{1 + n // 65536}.{n // 256 % 256}.{1 + n % 250}:1\n"
                             for n in range(HOSTS)))
    script = write_script(tmp_path / "hosts.sh", f"cat {hosts}\n")
    started = time.monotonic()
    proc, tag = start_job(["--host-discovery-script", str(script), "--min-np", "1", "-np", "1",
                           "--max-np", "1", PYTHON, "-c", "import time; time.sleep(30)"])
    try:
        assert proc.stderr is not None
        url = _status_url(proc.stderr, started + STATUS_WITHIN_S)
        with urllib.request.urlopen(url, timeout=max(0.1, started + STATUS_WITHIN_S
                                                     - time.monotonic())) as answer:
            assert answer.status == 200
        took = time.monotonic() - started
        assert took < STATUS_WITHIN_S, f"/status answered after {took:.1f}s"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert_no_orphans(tag)
    print(f"/status after {took:.2f}s", file=sys.stderr)
