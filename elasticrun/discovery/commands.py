"""Running a discovery command (a script, scontrol, sinfo): bounded, in its own process group,
with its failure as one DiscoveryError line."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Mapping, Sequence

from elasticrun.errors import DiscoveryError
from elasticrun.spawning import die_with_parent, kill_session, signal_session, spawn_session
from elasticrun.timed import within

MAX_OUTPUT_BYTES = 1024 * 1024


async def run_command(argv: Sequence[str], timeout: float, name: str,
                      env: Mapping[str, str] | None = None) -> str:
    """The command's standard output; `name` says what it is in an error."""
    try:
        proc = await spawn_session(
            argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env) if env is not None else None,
            # a driver SIGKILLed mid-poll (its journal lets it be resumed) leaves no script
            preexec_fn=die_with_parent(signal.SIGKILL),
        )
    except FileNotFoundError:
        raise DiscoveryError(f"{name}: {argv[0]} not found") from None
    except OSError as exc:
        raise DiscoveryError(f"{name}: cannot run: {exc.strerror}") from None
    try:
        out, err = await within(proc.communicate(), timeout)
    except TimeoutError:
        await kill_session(proc)
        raise DiscoveryError(f"{name}: no answer within {timeout:g}s") from None
    except BaseException:  # cancelled: the job is ending, and the command goes first
        await kill_session(proc)
        raise
    signal_session(proc.pid, signal.SIGKILL)  # whatever it left behind in its group
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


def _last_line(data: bytes) -> str:
    lines = [line.strip() for line in data.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""
