"""Running a discovery command (a script, scontrol, sinfo): bounded, in its own process group,
with its failure as one DiscoveryError line."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Mapping, Sequence

from elasticrun.errors import DiscoveryError
from elasticrun.timed import within

MAX_OUTPUT_BYTES = 1024 * 1024


async def run_command(argv: Sequence[str], timeout: float, name: str,
                      env: Mapping[str, str] | None = None) -> str:
    """The command's standard output; `name` says what it is in an error."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env=dict(env) if env is not None else None,
        )
    except FileNotFoundError:
        raise DiscoveryError(f"{name}: {argv[0]} not found") from None
    except OSError as exc:
        raise DiscoveryError(f"{name}: cannot run: {exc.strerror}") from None
    try:
        out, err = await within(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        _kill_group(proc.pid)
        await proc.wait()
        raise DiscoveryError(f"{name}: no answer within {timeout:g}s") from None
    except BaseException:
        _kill_group(proc.pid)
        raise
    _kill_group(proc.pid)  # whatever it left behind in its group
    if proc.returncode != 0:
        last = _last_line(err)
        detail = f": {last}" if last else ""
        raise DiscoveryError(f"{name}: exited with code {proc.returncode}{detail}")
    if len(out) > MAX_OUTPUT_BYTES:
        raise DiscoveryError(f"{name}: printed more than {MAX_OUTPUT_BYTES} bytes")
    try:
        return out.decode()
    except UnicodeDecodeError:
        raise DiscoveryError(f"{name}: printed bytes that are not UTF-8 text") from None


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _last_line(data: bytes) -> str:
    lines = [line.strip() for line in data.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""
