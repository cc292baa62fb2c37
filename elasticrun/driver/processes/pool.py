"""The worker pool: starting, watching and stopping the driver's worker processes.

The pool knows processes, not policy: it reports every exit, and stops what it is told to.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from elasticrun import protocol
from elasticrun.driver.processes.output import OutputRouter
from elasticrun.driver.processes.records import (
    INTRA_OP_THREADS,
    EnvSettings,
    Placed,
    WorkerProcessRecord,
    job_env,
)
from elasticrun.driver.rounds.assignment import SlotId
from elasticrun.launch.base import Launcher, WorkerProcess, WorkerSpec
from elasticrun.system.process_view import ProcessState, ProcessView
from elasticrun.system.timed import within

log = logging.getLogger("elasticrun.driver")

PUMP_DRAIN_S = 2.0  # after an exit, how long its last output may take to arrive
# How long a worker's host gets to say what its process is doing (a hang is suspected):
# beyond it, the host counts as unreachable (a frozen host, a cut link). Not shorter: a host
# under load answers slowly, and is not to be taken for a cut one.
INSPECT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class PoolSettings:
    command: tuple[str, ...]
    working_dir: Path
    grace_period: float
    env_settings: EnvSettings
    launcher_env: Mapping[str, str]  # the environment workers inherit (launcher_env())
    extra_env: Mapping[str, str]  # set for every worker of the job, on top of its place


class WorkerPool:
    def __init__(
        self,
        settings: PoolSettings,
        launcher: Launcher,
        address_for: Callable[[str], Awaitable[str]],
        output: OutputRouter,
        on_exit: Callable[[str, int, bool], None],
        rank_of: Callable[[str], int],
    ) -> None:
        self._settings = settings
        self._launcher = launcher
        self._address_for = address_for
        self._output = output
        self._on_exit = on_exit
        self._rank_of = rank_of
        self._processes: dict[str, WorkerProcessRecord] = {}
        self._stops: set[asyncio.Task[None]] = set()
        self._threads_told = False

    def stderr_tail(self, worker_id: str) -> list[str]:
        record = self._processes.get(worker_id)
        return list(record.stderr_tail) if record is not None else []

    async def spawn(self, worker_id: str, slot: SlotId, placed: Placed,
                    master: tuple[str, int]) -> None:
        """Starts a worker; raises SpawnError."""
        settings = self._settings
        env = job_env(settings.env_settings, worker_id, placed, *master, settings.launcher_env)
        defaulted_threads = INTRA_OP_THREADS in env and INTRA_OP_THREADS not in settings.extra_env
        env.update(settings.extra_env)
        if defaulted_threads and not self._threads_told:
            self._threads_told = True
            log.warning("%s is not set: workers that share a host get %s=1 each, as under "
                        "torchrun (set it to give each more threads)", INTRA_OP_THREADS,
                        INTRA_OP_THREADS)
        env[protocol.ENV_RENDEZVOUS_ADDR] = await self._address_for(slot.host)
        process = await self._launcher.start(WorkerSpec(
            worker_id, slot.host, settings.command, settings.working_dir, env,
            settings.launcher_env))
        self.adopt(worker_id, slot, process, placed.restarts)

    def adopt(self, worker_id: str, slot: SlotId, process: WorkerProcess,
              attempt: int = 0) -> None:
        """Watches `process` as this pool's (one it started, or one a resumed driver takes
        back): its output is forwarded, its exit reported, it is stopped when told."""
        record = WorkerProcessRecord(worker_id, slot, process, attempt)
        self._processes[worker_id] = record
        record.watcher = asyncio.get_running_loop().create_task(self._watch(record))

    async def _watch(self, record: WorkerProcessRecord) -> None:
        process = record.process
        rank = lambda: self._rank_of(record.id)  # noqa: E731 - its rank changes with rounds
        local_rank = record.slot.index  # a slot's index on its host is its local rank
        place = (record.slot.host, record.attempt)
        pumps = [
            asyncio.create_task(self._output.pump(process.stdout, "stdout", rank,
                                                  local_rank=local_rank, place=place)),
            asyncio.create_task(self._output.pump(process.stderr, "stderr", rank,
                                                  record.stderr_tail, local_rank, place)),
        ]
        code = await process.wait()
        _, pending = await asyncio.wait(pumps, timeout=PUMP_DRAIN_S)
        for pump in pending:
            pump.cancel()
        record.exit_code = code
        self._on_exit(record.id, code, bool(getattr(process, "host_lost", False)))
        del self._processes[record.id]  # its tail went with the exit report

    def stop(self, worker_ids: Iterable[str], kill: bool = False) -> None:
        """Stops the given workers (in the background); `kill`: with no grace period."""
        for worker_id in worker_ids:
            record = self._processes.get(worker_id)
            if record is None or not record.alive:
                continue
            task = asyncio.get_running_loop().create_task(
                record.process.stop(0.0 if kill else self._settings.grace_period))
            self._stops.add(task)
            task.add_done_callback(self._stops.discard)

    async def inspect(self, worker_ids: Iterable[str]) -> dict[str, ProcessView]:
        """What each worker's process is doing, as its host says (bounded: a host that does
        not answer within INSPECT_TIMEOUT_S is unreachable)."""
        ids = list(worker_ids)
        views = await asyncio.gather(*(self._inspect_one(i) for i in ids))
        return dict(zip(ids, views, strict=True))

    async def _inspect_one(self, worker_id: str) -> ProcessView:
        record = self._processes.get(worker_id)
        if record is None:
            return ProcessView(ProcessState.GONE)
        ask = getattr(record.process, "inspect", None)
        if ask is None:
            return ProcessView(ProcessState.UNKNOWN, "its launcher cannot tell")
        try:
            view: ProcessView = await within(ask(), INSPECT_TIMEOUT_S)
        except TimeoutError:
            return ProcessView(ProcessState.UNREACHABLE,
                               f"no answer within {INSPECT_TIMEOUT_S:g}s")
        except (OSError, EOFError) as exc:
            return ProcessView(ProcessState.UNREACHABLE, str(exc) or type(exc).__name__)
        return view

    async def stop_all(self) -> None:
        """Stops every live worker and waits (bounded) for their watchers to finish."""
        alive = [r for r in self._processes.values() if r.alive]
        if alive:
            log.info("stopping %d worker(s)", len(alive))
        grace = self._settings.grace_period
        await asyncio.gather(*(r.process.stop(grace) for r in alive), *self._stops,
                             return_exceptions=True)
        watchers = [r.watcher for r in self._processes.values() if r.watcher is not None]
        if watchers:
            await asyncio.wait(watchers, timeout=grace + 5.0)
