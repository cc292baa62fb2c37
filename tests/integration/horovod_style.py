"""Horovod's elastic integration scenarios, run with elasticrun: a discovery script that
lists the hosts a schedule gives for the current epoch (the number of lines rank 0 has
logged), and the Horovod-style training script (scripts/horovod_style_main.py).

All host names are local (localhost, 127.0.0.x): each runs its workers as subprocesses.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path

from tests.integration.harness import PYTHON, SCRIPTS, JobResult, run_job, write_script

MAIN = SCRIPTS / "horovod_style_main.py"
Schedule = list[tuple[int | None, list[str]]]  # (epoch, or None for "every later one"; hosts)


def discovery_script(path: Path, logfile: Path, schedule: Schedule) -> Path:
    """A script printing the hosts of the epoch that `logfile`'s line count says it is."""
    lines = [f"epoch=$(cat {shlex.quote(str(logfile))} 2>/dev/null | wc -l)", "case $epoch in"]
    for epoch, hosts in schedule:
        pattern = "*" if epoch is None else str(epoch)
        echoes = "; ".join(f"echo {shlex.quote(host)}" for host in hosts) or ":"
        lines.append(f"  {pattern}) {echoes} ;;")
    lines.append("esac")
    return write_script(path, "\n".join(lines) + "\n")


def command(tmp_path: Path, schedule: Schedule, *, np: int = 2, min_np: int = 2,
            max_np: int = 4, flags: Sequence[str] = (), script_args: Sequence[str] = (),
            exit_schedule: dict[str, list[int]] | None = None,
            exit_mode: str = "exception") -> tuple[list[str], Path]:
    """The elasticrun arguments of one scenario, and the log file rank 0 writes."""
    logfile = tmp_path / "epochs.jsonl"
    hosts = discovery_script(tmp_path / "discover.sh", logfile, schedule)
    args = ["-np", str(np), "--min-np", str(min_np), "--max-np", str(max_np),
            "--host-discovery-script", str(hosts), "--discovery-interval", "0.1", *flags,
            PYTHON, str(MAIN), "--logfile", str(logfile),
            "--discovery-schedule", json.dumps(schedule), *script_args]
    if exit_schedule:
        args += ["--exit-schedule", json.dumps(exit_schedule), "--exit-mode", exit_mode]
    return args, logfile


def run(tmp_path: Path, schedule: Schedule, *, timeout: float = 150.0,
        **options: object) -> tuple[JobResult, list[dict]]:
    """Runs one scenario to its end (no process may outlive it); returns the job and the
    epoch records rank 0 logged."""
    args, logfile = command(tmp_path, schedule, **options)  # type: ignore[arg-type]
    result = run_job(args, timeout=timeout)
    return result, read_records(logfile)


def read_records(logfile: Path) -> list[dict]:
    return [json.loads(line) for line in logfile.read_text().splitlines()] \
        if logfile.exists() else []
