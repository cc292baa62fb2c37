"""The executor: one event queue feeding the round machine, whose actions it carries out.

One asyncio process, no torch. Every decision is the machine's (rounds/); the parts here
only turn the world into events (discovery polls, worker requests, process exits, signals,
timers) and actions into effects (spawns, stops, server answers, telemetry, the result).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import time
from collections.abc import Mapping
from typing import Any

from elasticrun import protocol
from elasticrun.driver.hosts.watcher import HostWatcher
from elasticrun.driver.journal.opening import JobRecord, open_journal
from elasticrun.driver.journal.resuming import Resumed, take_over
from elasticrun.driver.journal.writer import JournalWriter
from elasticrun.driver.operate.failures import FailureLog
from elasticrun.driver.operate.flash_cadence import FlashCadences
from elasticrun.driver.operate.routes import OperatorRoutes
from elasticrun.driver.operate.target import JobOperator
from elasticrun.driver.operate.telemetry import Telemetry
from elasticrun.driver.operate.timeline import JobTimeline
from elasticrun.driver.parts import JobParts
from elasticrun.driver.processes import snapshot_dirs
from elasticrun.driver.processes.output import OutputRouter
from elasticrun.driver.processes.records import new_worker_id
from elasticrun.driver.processes.script_kind import calls_init
from elasticrun.driver.processes.snapshot_dirs import snapshot_directory
from elasticrun.driver.queue import EventQueue
from elasticrun.driver.rounds import events as ev
from elasticrun.driver.rounds.machine import RoundMachine
from elasticrun.driver.server.app import WorkerServer
from elasticrun.driver.serving import addresses_for, announce, serve
from elasticrun.driver.workforce import Workforce
from elasticrun.job.config import DriverConfig
from elasticrun.job.errors import ElasticrunError, JobFailedError
from elasticrun.system.loop_signals import handling

log = logging.getLogger("elasticrun.driver")

SIGNALS = {signal.SIGINT: 130, signal.SIGTERM: 143}  # exit codes as a shell reports them
TASKS_STOP_S = 5.0  # how long the driver's own tasks get to stop once cancelled
# a discovery call's bound beyond --discovery-timeout: a script's own timeout (which kills
# it and says so) comes first; a plugin that hangs fails the poll
DISCOVERY_SLACK_S = 5.0


class Driver:
    def __init__(self, config: DriverConfig, parts: JobParts, output: OutputRouter,
                 extra_env: Mapping[str, str] | None = None) -> None:
        """`extra_env`: set for every worker of the job (elasticrun.run's env=)."""
        self._config = config
        self._output = output
        self.machine = RoundMachine(config, new_worker_id, elastic_scripts=calls_init(
            config.command, config.working_dir))
        self.job_id = secrets.token_hex(6)
        self._secret = protocol.new_secret()
        self._epoch = 1  # fencing: a resumed driver's is one more than its journal's
        self._resumed: Resumed | None = None
        self._superseded_by = 0  # a newer driver's epoch, once one took the job over
        if config.resume:
            assert config.state_dir is not None
            self._resumed = take_over(config.state_dir, self.machine.state.hosts)
            self.machine.state = self._resumed.state
            self.job_id = self._resumed.job.id
            self._secret = self._resumed.secret
            self._epoch = self._resumed.job.epoch + 1
        self._telemetry = Telemetry.for_config(config, self.job_id)
        self._launcher = parts.launcher
        self._extra_env = dict(extra_env or {})
        self._watcher = HostWatcher(parts.discovery, config.discovery_interval,
                                    self._telemetry.discovery_polled,
                                    config.discovery_timeout + DISCOVERY_SLACK_S)
        self._agents = parts.agents
        if self._agents is not None:
            self._agents.job_id = self.job_id
            self._agents.on_change = lambda: self._watcher.wake(poll=True)
            self._agents.on_drain = lambda host: self.post(ev.HostsDrained((host,)))
            self._agents.adopt = lambda host, worker, process: self._workers.adopt(
                host, worker, process)
            self._agents.outsiders = self._telemetry.outsiders
        flash = FlashCadences()
        self._operator = JobOperator(self.job_id, time.time(), config, self.machine.state,
                                     self._watcher, self._telemetry, self.post, self._epoch,
                                     flash)
        self._routes = OperatorRoutes(self._operator, config.webhook_token,
                                      config.slots_per_host or 1, self._telemetry.outsiders)
        self._timeline = JobTimeline(config.timeline_filename, config.timeline_mark_cycles)
        self._server = WorkerServer(self._secret, self.machine.state, self.post,
                                    self._timeline, self._epoch, self._superseded,
                                    self._telemetry.outsiders, flash)
        self.results = self._server.results  # elasticrun.run: the function out, results in
        self._failures = FailureLog(self._telemetry)
        self._workers = Workforce(config, parts.launcher, output, self._server, self.machine,
                                  self.post)
        self._journal: JournalWriter | None = None  # --state-dir
        self._events = EventQueue(self._handle, self._act)
        self._tasks: set[asyncio.Task[Any]] = set()

    # --- lifecycle ----------------------------------------------------------------------
    async def run(self) -> int:
        """Runs the job to its end. Returns the exit code; raises ElasticrunError on failure."""
        loop = asyncio.get_running_loop()
        self._finished: asyncio.Future[int] = loop.create_future()
        signals = contextlib.ExitStack()  # given back before the shutdown, as it is waited
        signals.enter_context(handling(loop, {
            sig: (self.post, (ev.Interrupted(sig.name, code),)) for sig, code in SIGNALS.items()}))
        code = 1
        error: str | None = "internal error"
        self._exit_code = 1
        self._end_reason = ""  # the job's failure, for the agents' nodes to say too
        try:
            await self._start()
            code = self._exit_code = await self._finished
            error = None if code == 0 else f"interrupted (exit code {code})"
            return code
        except ElasticrunError as exc:
            error = str(exc)
            raise
        finally:
            signals.close()
            self._telemetry.job_ended(code, error, self.machine.state.round_number)
            self._end_reason = error or ""
            await self._shutdown()

    async def _start(self) -> None:
        config = self._config
        if self._resumed is None:
            hosts = await self._watcher.first_poll()
        else:  # the job runs: a discovery that fails now keeps the journal's hosts
            found = await self._watcher.poll()
            hosts = self.machine.state.hosts.discovered if found is None else found
        self._timeline.start()
        placement = self._workers.placement
        placement.set_hosts(list(hosts))
        all_local = placement.all_local
        addresses = addresses_for(config, placement, hosts)
        routes = self._routes.routes() + (self._agents.routes() if self._agents else [])
        port = config.port
        if self._resumed is not None:  # the same port, and the new epoch on disk first
            port = self._resumed.job.port
            self._journal = await self._open_journal(port)
            self._open_pool(addresses.dialed[0], port, all_local)
        port = await serve(self._server, config, addresses, port, routes,
                           resumed=self._resumed is not None)
        serving = getattr(self._launcher, "serving", None)
        if serving is not None:  # local agents dial this port
            serving(port)
        announce(config, self.job_id, addresses, port)
        if config.state_dir is not None and self._journal is None:
            self._journal = await self._open_journal(port)
        if self._journal is not None:
            self._run_task(self._journal.heartbeat())
        self._telemetry.job_started(config, hosts, self._watcher.describe())
        if self._workers.pool is None:
            self._open_pool(addresses.dialed[0], port, all_local)
        if self._resumed is not None:
            self.post(ev.JobResumed(self._epoch, config.start_timeout, self._lost_with_driver()))
            self.post(ev.HostsFound(hosts))
        else:
            self.post(ev.JobStarted(hosts))
        self._run_task(self._watcher.run(lambda found: self.post(ev.HostsFound(found))))

    async def _open_journal(self, port: int) -> JournalWriter:
        config = self._config
        assert config.state_dir is not None
        journal = await open_journal(config.state_dir, JobRecord(
            self.job_id, self._epoch, port, tuple(config.command), os.getpid()), self._secret,
            self.machine.state)
        log.info("job %s: journal in %s (driver epoch %d)", self.job_id, config.state_dir,
                 self._epoch)
        return journal

    def _open_pool(self, address: str, port: int, all_local: bool) -> None:
        self._workers.open(self._secret, address, port, all_local,
                           {**self._timeline.worker_env(), **self._extra_env}, self.job_id)

    def _handle(self, event: ev.Event, now: float) -> list[ev.Action]:
        actions = self.machine.handle(event, now)
        if self._journal is not None:
            self._journal.mark()
        return actions

    async def _shutdown(self) -> None:
        self._workers.stopping = True
        self._events.close()
        for task in list(self._tasks):
            task.cancel()
        superseded = self._superseded_by > 0  # the job is another driver's: leave it be
        pool = self._workers.pool
        if pool is not None and not superseded:
            await pool.stop_all()
        if self._agents is not None and not superseded:
            await self._agents.close(self._exit_code, self._end_reason)
        if not superseded:  # (its local agents, its SSH connections are the job's now)
            await self._launcher.close()
        if self._tasks:
            # Bounded: a task that ignored its cancellation must not keep the launcher alive.
            _, stuck = await asyncio.wait(list(self._tasks), timeout=TASKS_STOP_S)
            if stuck:
                log.warning("%d driver task(s) did not stop within %gs: %s", len(stuck),
                            TASKS_STOP_S, ", ".join(sorted(repr(t.get_coro()) for t in stuck)))
        await self._server.stop()
        if self._journal is not None:
            if not superseded:
                await self._journal.flush()  # the job's end, for a --resume to refuse
            await self._journal.close()
        self._timeline.close()
        await self._telemetry.close()
        if not superseded and self._config.host_snapshots:
            snapshot_dirs.remove(snapshot_directory(self.job_id))

    def _run_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and (exc := t.exception()) is not None:
                self._crashed(exc)

        task.add_done_callback(done)

    def _crashed(self, exc: BaseException) -> None:
        if isinstance(exc, ElasticrunError):
            self._end(exc)
        else:
            log.error("internal error", exc_info=exc)
            self._end(JobFailedError(f"internal error: {exc!r}"))

    def _end(self, result: int | BaseException) -> None:
        if self._finished.done():
            return
        if isinstance(result, BaseException):
            self._finished.set_exception(result)
        else:
            self._finished.set_result(result)

    # --- the event queue ------------------------------------------------------------------
    def post(self, event: ev.Event) -> None:
        """Feeds `event` to the machine and carries out its actions (queue.py)."""
        if self._finished.done():
            self._events.close()  # the job is over: nothing is decided any more
        try:
            self._events.post(event)
        except Exception as exc:  # a bug in the machine or an action: the job stops
            self._crashed(exc)

    def _act(self, action: ev.Action) -> None:
        self._timeline.action(action)
        if self._server.carry_out(action):
            return
        if isinstance(action, ev.Spawn):
            self._run_task(self._workers.spawn(action))
        elif isinstance(action, ev.StopWorkers):
            if self._workers.pool is not None:
                self._workers.pool.stop(action.workers, kill=action.kill)
        elif isinstance(action, ev.InspectWorkers):
            self._run_task(self._workers.inspect(action))
        elif isinstance(action, ev.RecordFailure):
            pool = self._workers.pool
            tail = pool.stderr_tail(action.worker) if pool is not None else []
            self._failures.worker_failed(action.cause, host=action.host, kind=action.kind,
                                         rank=action.rank, exit_code=action.exit_code,
                                         stderr_tail=tail)
        elif isinstance(action, ev.Report):
            getattr(self._telemetry, action.name)(**action.fields)
        elif isinstance(action, ev.Log):
            log.log(logging.getLevelName(action.level.upper()), "%s", action.message)
        elif isinstance(action, ev.Finish):
            self._end(action.code)
        elif isinstance(action, ev.Fail):
            self._end(JobFailedError(action.message + self._failures.suffix(action.message)))

    def _lost_with_driver(self) -> tuple[str, ...]:
        """The kept workers whose launcher ended them with the old driver (SSH ones): the
        resumed driver does not wait for them."""
        outlives = getattr(self._launcher, "outlives_driver", None)
        return tuple(w.id for w in self.machine.state.workers.values()
                     if w.alive and (outlives is None or not outlives(w.slot.host)))

    # --- fencing -----------------------------------------------------------------------
    def _superseded(self, epoch: int) -> None:
        """A worker named a newer driver's epoch: this one was replaced (it was stopped, or
        cut off, while another resumed the job). It leaves without touching the job."""
        if self._superseded_by:
            return
        self._superseded_by = epoch
        self._end(JobFailedError(f"driver epoch {self._epoch} was superseded by epoch "
                                 f"{epoch} (a resumed driver took the job over); this one "
                                 f"exits and leaves the job to it"))
