"""The driver's hands on its workers: the pool they run in, the address each host dials,
and the machine's spawn and inspect actions carried out (results come back as events).

A resumed driver's pool also takes back the workers its journal kept (`adopt`): their
agents name them when they reconnect.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from elasticrun.driver.processes.output import OutputRouter
from elasticrun.driver.processes.placement import Placement
from elasticrun.driver.processes.pool import PoolSettings, WorkerPool
from elasticrun.driver.processes.records import EnvSettings, Placed
from elasticrun.driver.processes.snapshot_dirs import snapshot_directory
from elasticrun.driver.rounds import events as ev
from elasticrun.driver.rounds import resume
from elasticrun.driver.rounds.assignment import Assignment, hosts_in_rank_order
from elasticrun.driver.rounds.machine import RoundMachine
from elasticrun.driver.server.app import WorkerServer
from elasticrun.driver.server.listen import covered, dial_address
from elasticrun.job.config import DriverConfig
from elasticrun.job.errors import SpawnError
from elasticrun.launch.agents.process import AgentProcess
from elasticrun.launch.base import Launcher, launcher_env

log = logging.getLogger("elasticrun.driver")


class Workforce:
    def __init__(self, config: DriverConfig, launcher: Launcher, output: OutputRouter,
                 server: WorkerServer, machine: RoundMachine,
                 post: Callable[[ev.Event], None]) -> None:
        self._config = config
        self._launcher = launcher
        self._placement = Placement(config, launcher)
        self._output = output
        self._server = server
        self._machine = machine
        self._post = post
        self.pool: WorkerPool | None = None
        self.stopping = False
        self._master: tuple[Any, tuple[str, int]] | None = None
        self._round: tuple[Assignment, list[str], dict[str, int]] | None = None

    @property
    def placement(self) -> Placement:
        return self._placement

    def open(self, secret: str, address: str, port: int, all_local: bool,
             extra_env: Mapping[str, str], job_id: str) -> None:
        """The pool, once the driver's address and port are known."""
        config = self._config
        run_id = config.torchrun.run_id or job_id
        error_dir = Path("/tmp")
        if config.torchrun.log_dir is not None:  # error files go to the run's directory
            if self._output.run_dir is None:  # (the workers' hosts make it too)
                self._output.name_run(run_id)
            assert self._output.run_dir is not None
            error_dir = self._output.run_dir
        env = EnvSettings(
            rendezvous_addr=address, rendezvous_port=port, secret=secret,
            collective_timeout=config.collective_timeout,
            round_timeout=config.start_timeout + config.elastic_timeout,
            driver_timeout=config.driver_timeout, backend=config.backend, elastic=config.elastic,
            hang_detection=config.hang_detection,
            stragglers=config.stragglers,
            gloo_interface=config.network_interface or ("lo" if all_local else None),
            run_id=run_id, max_restarts=config.max_restarts, torchrun=config.torchrun,
            error_dir=error_dir,
            snapshot_dir=snapshot_directory(job_id) if config.host_snapshots else None,
            checkpoint_dir=config.checkpoint_dir,
            checkpoint_interval=config.checkpoint_interval, shard_size=config.shard_size)
        settings = PoolSettings(config.command, config.working_dir, config.stop_grace_period,
                                env, launcher_env(), extra_env)
        self.pool = WorkerPool(settings, self._launcher, self._dial_address, self._output,
                               lambda worker, code, lost: self._post(
                                   ev.WorkerExited(worker, code, lost)),
                               self._rank_of)

    async def spawn(self, action: ev.Spawn) -> None:
        assert self.pool is not None
        hosts, places = self._round_hosts(action.assignment)
        await self._placement.ready(action.slot.host, hosts)  # names looked up, bounded
        if self._master is None or self._master[0] is not action.assignment:
            # One MASTER_ADDR/PORT per round: torchrun-style scripts of a round must agree.
            self._master = (action.assignment,
                            self._placement.master_endpoint(action.assignment))
        master = self._master[1]
        placed = Placed(action.assignment[action.slot], action.round,
                        places[action.slot.host], len(hosts), action.restarts, action.restore)
        try:
            await self.pool.spawn(action.worker, action.slot, placed, master)
        except SpawnError as exc:
            self._post(ev.SpawnFailed(action.worker, str(exc)))
            return
        if self.stopping:
            self.pool.stop([action.worker])
        else:
            self._post(ev.WorkerStarted(action.worker))

    def _round_hosts(self, assignment: Assignment) -> tuple[list[str], dict[str, int]]:
        """The round's hosts in rank order and each one's place: once a round, not once a
        worker (10,000 workers would make it 10,000 sorts of 10,000 hosts)."""
        if self._round is None or self._round[0] is not assignment:
            hosts = hosts_in_rank_order(assignment)
            self._round = (assignment, hosts, {host: n for n, host in enumerate(hosts)})
        return self._round[1], self._round[2]

    async def inspect(self, action: ev.InspectWorkers) -> None:
        assert self.pool is not None
        views = await self.pool.inspect(action.workers)
        self._post(ev.ProcessesInspected(action.round, tuple(views.items())))

    def adopt(self, host: str, worker_id: str, process: AgentProcess) -> bool:
        """An agent that came back to this resumed driver runs `worker_id`: it is taken back
        if the journal kept it there."""
        state = self._machine.state
        if self.pool is None or not resume.takes_back(state, worker_id, host):
            return False
        self.pool.adopt(worker_id, state.workers[worker_id].slot, process)
        self._post(ev.WorkerBack(worker_id))
        return True

    def _rank_of(self, worker_id: str) -> int:
        worker = self._machine.state.workers.get(worker_id)
        return worker.rank if worker is not None else -1

    async def _dial_address(self, host: str) -> str:
        """The driver's address for workers on `host`, listened on before they dial it."""
        address = dial_address(self._config.bind, self._placement.address_for(host))
        if not covered(self._server.listening, address):
            try:
                await self._server.listen(address)
            except OSError as exc:
                raise SpawnError(f"the driver cannot listen on {address} (the address host "
                                 f"{host} reaches it at): {exc.strerror or exc}") from None
            log.info("the driver now also listens on %s (for host %s)", address, host)
        return address
