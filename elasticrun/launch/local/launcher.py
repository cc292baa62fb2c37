"""Local workers: subprocesses, each the leader of its own session and process group, forked
from a worker template when they are Python scripts (forked.py), exec'd otherwise.

If their parent (the driver, an agent, or srun's caller) is killed (SIGKILL: no chance to
stop anyone), the kernel sends each of them SIGTERM (Linux's parent-death signal), so none
outlives it.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

from elasticrun.job.errors import SpawnError
from elasticrun.launch.base import WorkerSpec
from elasticrun.launch.local.forked import ForkedProcess, Forker
from elasticrun.system.process_view import ProcessState, ProcessView, read_process_view
from elasticrun.system.spawning import die_with_parent, signal_session, spawn_session, stop_session

OUTPUT_LIMIT = 1024 * 1024  # bytes a reader buffers before the pump drains it
class LocalProcess:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        assert proc.stdout is not None and proc.stderr is not None
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.pid = proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def inspect(self) -> ProcessView:
        if self._proc.returncode is not None:
            return ProcessView(ProcessState.GONE)
        return read_process_view(self.pid)

    async def wait(self) -> int:
        code = await self._proc.wait()
        # Take down whatever the worker left behind in its group (dataloader workers, ...).
        signal_session(self.pid, signal.SIGKILL)
        return code

    async def stop(self, grace_period: float) -> None:
        await stop_session(self.pid, self._proc.wait(), grace_period)


async def start_local(command: Sequence[str], env: Mapping[str, str], cwd: Path,
                      death_signal: int = signal.SIGTERM) -> LocalProcess:
    """Starts `command` as a subprocess of this process, which gets `death_signal` when
    this process dies; raises SpawnError (one line)."""
    if not command:
        raise SpawnError("no command to start")
    try:
        proc = await spawn_session(
            command,
            env=dict(env),
            cwd=str(cwd),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=die_with_parent(death_signal),
            limit=OUTPUT_LIMIT,
        )
    except FileNotFoundError as exc:
        if exc.filename == str(cwd):
            raise SpawnError(f"cannot start {command[0]!r}: no directory {str(cwd)!r}") from None
        raise SpawnError(f"cannot start {command[0]!r}: command not found") from None
    except PermissionError:
        raise SpawnError(f"cannot start {command[0]!r}: permission denied") from None
    except OSError as exc:
        raise SpawnError(f"cannot start {command[0]!r}: {exc.strerror}") from None
    return LocalProcess(proc)


class LocalLauncher:
    """Workers as subprocesses of the driver, on this machine."""

    def __init__(self) -> None:
        self._forker = Forker(signal.SIGTERM, die_with_parent(signal.SIGTERM))

    async def start(self, spec: WorkerSpec) -> LocalProcess | ForkedProcess:
        env = spec.env
        forked = await self._forker.start(spec.command, env, spec.cwd)
        if forked is not None:
            return forked
        return await start_local(spec.command, env, spec.cwd)

    async def close(self) -> None:
        await self._forker.close()

