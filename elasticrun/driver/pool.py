"""The worker pool: starting, watching and stopping the driver's worker processes.

The pool knows processes, not policy: it reports every exit to the driver, which
decides what the exit means.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from elasticrun import protocol
from elasticrun.driver.assignment import SlotId
from elasticrun.driver.output import OutputRouter
from elasticrun.driver.workers import EnvSettings, Worker, WorkerState, worker_env
from elasticrun.errors import SpawnError
from elasticrun.protocol import SlotInfo
from elasticrun.spawn.base import Spawner

log = logging.getLogger("elasticrun.driver")

PUMP_DRAIN_S = 2.0  # after an exit, how long its last output may take to arrive


@dataclass(frozen=True)
class PoolSettings:
    command: tuple[str, ...]
    working_dir: Path
    grace_period: float
    env_settings: EnvSettings
    base_env: Mapping[str, str]


class WorkerPool:
    def __init__(
        self,
        settings: PoolSettings,
        spawner_for: Callable[[str], Spawner],
        address_for: Callable[[str], Awaitable[str]],
        output: OutputRouter,
        on_exit: Callable[[Worker, int], None],
    ) -> None:
        self._settings = settings
        self._spawner_for = spawner_for
        self._address_for = address_for
        self._output = output
        self._on_exit = on_exit
        self.workers: dict[str, Worker] = {}
        self._stops: set[asyncio.Task[None]] = set()

    def get(self, worker_id: str) -> Worker | None:
        return self.workers.get(worker_id)

    def holder(self, slot: SlotId) -> Worker | None:
        """The live worker that holds `slot` (a member or a standby), if any."""
        for worker in self.workers.values():
            if worker.slot == slot and worker.alive and worker.state is WorkerState.RUNNING:
                return worker
        return None

    async def spawn(self, worker_id: str, slot: SlotId, info: SlotInfo,
                    master: tuple[str, int]) -> Worker:
        """Starts a worker; raises SpawnError (the worker is then recorded as failed)."""
        worker = Worker(id=worker_id, slot=slot, rank=info.rank)
        self.workers[worker_id] = worker
        settings = self._settings
        env = worker_env(settings.base_env, settings.env_settings, worker_id, info, *master)
        try:
            env[protocol.ENV_RENDEZVOUS_ADDR] = await self._address_for(slot.host)
            worker.process = await self._spawner_for(slot.host).spawn(
                slot.host, settings.command, env, settings.working_dir)
        except SpawnError:
            worker.exit_code = 127
            worker.state = WorkerState.FAILED
            raise
        worker.watcher = asyncio.get_running_loop().create_task(self._watch(worker))
        return worker

    async def _watch(self, worker: Worker) -> None:
        process = worker.process
        assert process is not None
        pumps = [
            asyncio.create_task(self._output.pump(process.stdout, "stdout", lambda: worker.rank)),
            asyncio.create_task(self._output.pump(
                process.stderr, "stderr", lambda: worker.rank, worker.stderr_tail)),
        ]
        code = await process.wait()
        _, pending = await asyncio.wait(pumps, timeout=PUMP_DRAIN_S)
        for pump in pending:
            pump.cancel()
        worker.exit_code = code
        self._on_exit(worker, code)

    def stop_host(self, host: str) -> None:
        """Stops every live worker on `host` (in the background)."""
        self._stop_where(lambda worker: worker.slot.host == host)

    def stop_host_slot(self, slot: SlotId) -> None:
        """Stops the live worker holding `slot` (in the background)."""
        self._stop_where(lambda worker: worker.slot == slot)

    def _stop_where(self, chosen: Callable[[Worker], bool]) -> None:
        for worker in self.workers.values():
            if chosen(worker) and worker.alive and worker.process is not None and \
                    worker.state in (WorkerState.RUNNING, WorkerState.RELEASED):
                worker.state = WorkerState.STOPPING
                task = asyncio.get_running_loop().create_task(
                    worker.process.stop(self._settings.grace_period))
                self._stops.add(task)
                task.add_done_callback(self._stops.discard)

    async def stop_all(self) -> None:
        """Stops every live worker and waits (bounded) for their watchers to finish."""
        alive = [w for w in self.workers.values() if w.alive and w.process is not None]
        if alive:
            log.info("stopping %d worker(s)", len(alive))
        grace = self._settings.grace_period
        await asyncio.gather(*(w.process.stop(grace) for w in alive if w.process),
                             *self._stops, return_exceptions=True)
        watchers = [w.watcher for w in self.workers.values() if w.watcher is not None]
        if watchers:
            await asyncio.wait(watchers, timeout=grace + 5.0)
