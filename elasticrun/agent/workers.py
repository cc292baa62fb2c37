"""The workers one agent runs: local subprocesses that die with the agent (SIGKILL, the
parent-death signal), forked from a worker template when they can be (launch/local/forked.py),
whose output, start and exit become messages for the driver.

A start runs beside the agent's connection, never in its way: the first one starts the
template, whose imports take seconds (tens on a loaded host), and an agent that stopped
reading the driver's messages meanwhile would take the driver's silence for its loss. A
stop that comes while its worker is starting is kept, and done once the process exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from elasticrun import protocol
from elasticrun.job.errors import SpawnError
from elasticrun.launch.agents import wire
from elasticrun.launch.base import launcher_env
from elasticrun.launch.local.forked import ForkedProcess, Forker
from elasticrun.launch.local.launcher import LocalProcess, start_local
from elasticrun.system.process_view import ProcessState, ProcessView
from elasticrun.system.spawning import die_with_parent
from elasticrun.system.timed import within

log = logging.getLogger("elasticrun.agent")

Emit = Callable[[wire.Message], None]


@dataclass(eq=False)
class RunningWorker:
    id: str
    process: LocalProcess | ForkedProcess
    exit_code: int | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class AgentWorkers:
    """Starts, watches and stops workers; every event goes out through `emit`."""

    def __init__(self, token: str, working_dir: Path | None, emit: Emit) -> None:
        self._token = token
        self._working_dir = working_dir
        self._emit = emit
        self._running: dict[str, RunningWorker] = {}
        self._starting: dict[str, asyncio.Task[None]] = {}
        self._stop_when_started: dict[str, float] = {}  # worker id: its stop's grace
        self._base_env = launcher_env(os.environ)  # the agent token stays with the agent
        self.changed = asyncio.Event()  # a worker started or ended
        # Where the job's workers here keep snapshots of its commits (removed at its end).
        self.snapshot_dirs: set[str] = set()
        self._forker = Forker(signal.SIGKILL, die_with_parent(signal.SIGKILL))

    def ids(self) -> list[str]:
        return [*self._running, *self._starting]

    def __len__(self) -> int:
        return len(self._running) + len(self._starting)

    def begin(self, message: wire.Start) -> None:
        """Starts the worker in the background (see the module's docstring)."""
        worker = message.worker
        if worker in self._running or worker in self._starting:
            return
        task = asyncio.get_running_loop().create_task(self._start(message))
        self._starting[worker] = task
        task.add_done_callback(lambda _: self._starting.pop(worker, None))

    async def _start(self, message: wire.Start) -> None:
        try:
            env = {**self._base_env, **wire.unseal(self._token, message.worker, message.env)}
            if env.get(protocol.ENV_SNAPSHOT_DIR):
                self.snapshot_dirs.add(env[protocol.ENV_SNAPSHOT_DIR])
            cwd = self._working_dir or Path(message.cwd)
            process = await self._forker.start(message.command, env, cwd) \
                or await start_local(message.command, env, cwd, signal.SIGKILL)
        except (wire.BadMessage, SpawnError) as exc:
            self._stop_when_started.pop(message.worker, None)
            self._emit(wire.StartFailed(message.worker, str(exc)))
            return
        worker = RunningWorker(message.worker, process)
        self._running[worker.id] = worker
        loop = asyncio.get_running_loop()
        worker.tasks = [loop.create_task(self._pump(worker, stream, reader)) for stream, reader
                        in zip(wire.STREAMS, (process.stdout, process.stderr), strict=True)]
        worker.tasks.append(loop.create_task(self._watch(worker)))
        self._emit(wire.Started(worker.id, process.pid))
        self.changed.set()
        grace = self._stop_when_started.pop(worker.id, None)
        if grace is not None:
            self.stop(worker.id, grace)

    def stop(self, worker_id: str, grace: float) -> None:
        worker = self._running.get(worker_id)
        if worker is not None:
            asyncio.get_running_loop().create_task(worker.process.stop(grace))
        elif worker_id in self._starting:
            self._stop_when_started[worker_id] = grace

    async def inspect(self, worker_id: str) -> ProcessView:
        worker = self._running.get(worker_id)
        if worker is None:
            return ProcessView(ProcessState.RUNNING, "starting") \
                if worker_id in self._starting else ProcessView(ProcessState.GONE)
        return await worker.process.inspect()

    async def stop_all(self, grace: float) -> None:
        """Stops every worker and waits (bounded by the grace and a few seconds) for them.
        Starts under way are cancelled first (a cancelled start leaves no process)."""
        starting = list(self._starting.values())
        for task in starting:
            task.cancel()
        if starting:
            await asyncio.wait(starting, timeout=5.0)
        workers = list(self._running.values())
        await asyncio.gather(*(w.process.stop(grace) for w in workers), return_exceptions=True)
        tasks = [task for w in workers for task in w.tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        await self._forker.close()

    async def _pump(self, worker: RunningWorker, stream: str,
                    reader: asyncio.StreamReader) -> None:
        while True:
            try:
                data = await reader.read(wire.MAX_OUTPUT_CHUNK)
            except (OSError, ValueError):
                data = b""
            self._emit(wire.output_chunk(worker.id, stream, data))
            if not data:
                return

    async def _watch(self, worker: RunningWorker) -> None:
        code = await worker.process.wait()
        pumps = worker.tasks[:2]
        with contextlib.suppress(asyncio.TimeoutError):
            await within(asyncio.gather(*pumps), 2.0)
        worker.exit_code = code
        del self._running[worker.id]
        log.debug("worker %s exited with %d", worker.id, code)
        self._emit(wire.Exited(worker.id, code))
        self.changed.set()
