"""Running a discovery command (a script, scontrol, sinfo): bounded, in its own process group,
with its failure as one DiscoveryError line.

Bounded in memory too: its output is read in chunks and the command is killed as soon as it
passes MAX_OUTPUT_BYTES; of its stderr only the last STDERR_TAIL_BYTES are kept (for the
last line, printed with its control characters escaped)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Mapping, Sequence

from elasticrun.job.errors import DiscoveryError
from elasticrun.system.printable import printable
from elasticrun.system.spawning import die_with_parent, kill_session, signal_session, spawn_session
from elasticrun.system.timed import within

MAX_OUTPUT_BYTES = 1024 * 1024
STDERR_TAIL_BYTES = 4096
_CHUNK_BYTES = 64 * 1024


class _TooMuchOutput(Exception):
    """The command printed more than MAX_OUTPUT_BYTES."""


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
        out, err = await within(_outputs(proc), timeout)
    except TimeoutError:
        await kill_session(proc)
        raise DiscoveryError(f"{name}: no answer within {timeout:g}s") from None
    except _TooMuchOutput:
        await kill_session(proc)
        raise DiscoveryError(f"{name}: printed more than {MAX_OUTPUT_BYTES} bytes") from None
    except BaseException:  # cancelled: the job is ending, and the command goes first
        await kill_session(proc)
        raise
    signal_session(proc.pid, signal.SIGKILL)  # whatever it left behind in its group
    if proc.returncode != 0:
        last = _last_line(err)
        detail = f": {last}" if last else ""
        raise DiscoveryError(f"{name}: exited with code {proc.returncode}{detail}")
    try:
        return out.decode()
    except UnicodeDecodeError:
        raise DiscoveryError(f"{name}: printed bytes that are not UTF-8 text") from None


async def _outputs(proc: asyncio.subprocess.Process) -> tuple[bytes, bytes]:
    """Standard output (_TooMuchOutput past the cap) and the tail of standard error, both
    read to their end, and the command's exit."""
    assert proc.stdout is not None and proc.stderr is not None
    err_task = asyncio.ensure_future(_read_tail(proc.stderr, STDERR_TAIL_BYTES))
    try:
        out = await _read_capped(proc.stdout, MAX_OUTPUT_BYTES)
        err = await err_task
    finally:
        err_task.cancel()  # nothing when it is done; else the command is being killed
    await proc.wait()
    return out, err


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> bytes:
    data = bytearray()
    while chunk := await stream.read(_CHUNK_BYTES):
        data += chunk
        if len(data) > cap:
            raise _TooMuchOutput
    return bytes(data)


async def _read_tail(stream: asyncio.StreamReader, keep: int) -> bytes:
    tail = b""
    while chunk := await stream.read(_CHUNK_BYTES):
        tail = (tail + chunk)[-keep:]
    return tail


def _last_line(data: bytes) -> str:
    lines = [line.strip() for line in data.decode(errors="replace").splitlines() if line.strip()]
    return printable(lines[-1][:200]) if lines else ""
