"""Hostile discovery output: host names and IPv6 scope ids by the rules of their kind, output
capped while it is read, a failing script's stderr and a worker's last lines printed with
their control characters escaped."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from elasticrun.discovery.commands import MAX_OUTPUT_BYTES, run_command
from elasticrun.discovery.parsing import format_hosts, parse_host_entry, parse_host_lines
from elasticrun.driver.operate.failures import FailureLog
from elasticrun.job.errors import DiscoveryError

SRC = "discovery script ./hosts.sh"
_RAW = ("\x1b", "\x07", "\x00", "\x9b")


def _script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("line", [
    "::1%$(id):1", "[::1%$(id)]:1", "::1%\x1b[2J:1", "[::1%\x1b[2J]:1", "fe80::1%:1",
    "fe80::1%eth0;reboot", "fe80::1%averyveryverylongname", "fe80::1%eth 0 slots=1",
])
def test_scope_ids_other_than_interface_names_or_numbers_are_refused(line: str) -> None:
    with pytest.raises(DiscoveryError) as info:
        parse_host_lines(f"127.0.0.1:1\n{line}\n", 1, SRC)
    message = str(info.value)
    assert message.startswith(f"{SRC}: line 2: ")
    assert "\n" not in message and not any(ch in message for ch in _RAW)


@pytest.mark.parametrize(("entry", "host"), [
    ("[fe80::1%eth0]:2", "fe80::1%eth0"), ("fe80::1%2", "fe80::1%2"),
    ("[fe80::1%enp0s31f6.100]:2", "fe80::1%enp0s31f6.100"), ("node-1.example.com:2", None),
    ("my_host:2", None),
])
def test_interface_names_numbers_and_rfc1123_names_pass(entry: str, host: str | None) -> None:
    found, _ = parse_host_entry(entry, 1)
    assert found == (host or entry.rsplit(":", 1)[0])


@pytest.mark.parametrize("entry", [
    "a..b", "-node", "node-", "a" * 64 + ".example", "node;id", "node$(id)", "no\x1bde",
    "node`id`", "a.-b",
])
def test_names_other_than_rfc1123_labels_are_refused(entry: str) -> None:
    with pytest.raises(ValueError):
        parse_host_entry(entry, 1)


def test_format_hosts_escapes_what_it_is_given() -> None:
    assert format_hosts({"a\x1b[2Jb": 1}) == "a\\x1b[2Jb:1"


async def test_a_failing_scripts_stderr_is_reported_escaped(tmp_path: Path) -> None:
    script = _script(tmp_path, "printf 'boom \\033]0;owned\\007 \\033[2J nul:\\000 end\\n' >&2\n"
                               "exit 3\n")
    with pytest.raises(DiscoveryError) as info:
        await run_command([str(script)], 10.0, "discovery script")
    message = str(info.value)
    assert "exited with code 3" in message
    assert "boom \\x1b]0;owned\\x07 \\x1b[2J nul:\\x00 end" in message
    assert not any(ch in message for ch in _RAW)


async def test_only_the_tail_of_a_huge_stderr_is_kept(tmp_path: Path) -> None:
    script = _script(tmp_path, "head -c 5000000 /dev/zero | tr '\\0' x >&2\n"
                               "echo >&2; echo 'the last line' >&2; exit 1\n")
    with pytest.raises(DiscoveryError, match="exited with code 1: the last line$"):
        await run_command([str(script)], 10.0, "discovery script")


_MEASURE = textwrap.dedent("""
    import asyncio, resource, sys, time
    from elasticrun.discovery.commands import run_command
    from elasticrun.job.errors import DiscoveryError
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    try:
        asyncio.run(run_command([sys.argv[1]], 60.0, "discovery script"))
        print("accepted")
    except DiscoveryError as exc:
        print(exc)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(grown // 1024, time.monotonic() - start)
""")


def test_100_mb_of_output_is_refused_at_the_cap_without_being_held(tmp_path: Path) -> None:
    """Before: the whole output was read (communicate()), then measured: +200 MiB."""
    script = _script(tmp_path, "yes 127.0.0.1:1 | head -c 100000000\n")
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(script)], capture_output=True,
                          text=True, timeout=60, check=True)
    refusal, numbers = done.stdout.strip().splitlines()
    grown_mib, seconds = int(numbers.split()[0]), float(numbers.split()[1])
    assert refusal == f"discovery script: printed more than {MAX_OUTPUT_BYTES} bytes"
    assert grown_mib < 32, f"the driver grew {grown_mib} MiB reading discovery output"
    assert seconds < 10


class _Telemetry:
    def worker_failed(self, **_: Any) -> None:
        pass


def test_a_workers_last_lines_are_escaped_in_the_failure_summary() -> None:
    failures = FailureLog(_Telemetry())  # type: ignore[arg-type]
    failures.worker_failed("rank 0 on 127.0.0.1 exited with code 1 \x1b[31m", host="127.0.0.1",
                           kind="exit_code", rank=0, exit_code=1,
                           stderr_tail=["Traceback \x1b[2J\x1b]0;owned\x07", "bell\x07 nul\x00"])
    summary = failures.suffix("the job failed")
    assert "Traceback \\x1b[2J\\x1b]0;owned\\x07" in summary
    assert "bell\\x07 nul\\x00" in summary
    assert "exited with code 1 \\x1b[31m" in summary
    assert not any(ch in summary for ch in _RAW)


async def test_slow_commands_still_time_out(tmp_path: Path) -> None:
    script = _script(tmp_path, "echo 127.0.0.1:1; exec sleep 30\n")
    start = time.monotonic()
    with pytest.raises(DiscoveryError, match="no answer within 0.5s"):
        await run_command([str(script)], 0.5, "discovery script")
    assert time.monotonic() - start < 5
