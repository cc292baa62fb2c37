"""The control loop: decides rounds from host and worker state, and carries the decisions out.

One asyncio process, no torch. Policy lives in assignment.py and hosts.py; this module
reacts to events (worker exits, workers asking for a new round, discovery results,
timers) and turns them into rounds, spawns, stops and the job's result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

from elasticrun import protocol
from elasticrun.config import DriverConfig
from elasticrun.discovery.base import HostDiscovery, HostSlots
from elasticrun.driver.assignment import (
    Assignment,
    SlotId,
)
from elasticrun.driver.capacity import shortfall, start_refusal
from elasticrun.driver.control import Control
from elasticrun.driver.failures import FailureLog
from elasticrun.driver.hosts import HostRegistry
from elasticrun.driver.hostwatch import HostWatcher, format_hosts
from elasticrun.driver.listen import covered, dial_address, listen_addresses, wildcard_warning
from elasticrun.driver.metrics import failure_cause
from elasticrun.driver.operator import OperatorEndpoints
from elasticrun.driver.output import OutputRouter
from elasticrun.driver.placement import Placement
from elasticrun.driver.planner import RoundPlanner
from elasticrun.driver.pool import PoolSettings, WorkerPool
from elasticrun.driver.rendezvous import Rendezvous
from elasticrun.driver.standby import Standbys
from elasticrun.driver.status import JobView
from elasticrun.driver.telemetry import Telemetry
from elasticrun.driver.workers import (
    EnvSettings,
    Worker,
    WorkerState,
    describe_exit,
    launcher_env,
    new_worker_id,
)
from elasticrun.errors import ConfigError, ElasticrunError, JobFailedError, SpawnError
from elasticrun.spawn.base import Spawner

log = logging.getLogger("elasticrun.driver")

FAILURE_COALESCE_S = 0.05  # let a whole host's exits arrive before the next round is cut
UNEXPLAINED_RESET_GRACE_S = 0.5  # a worker saw a failure the driver has not seen yet
REJOIN_SLACK_S = 5.0  # beyond the collective timeout, for a running worker to rejoin
SYNC_REPORT_GRACE_S = 2.0
EXIT_CODE_SIGINT = 130
EXIT_CODE_SIGTERM = 143


class Driver:
    def __init__(
        self,
        config: DriverConfig,
        discovery: HostDiscovery,
        output: OutputRouter,
        spawner_for: Callable[[str], Spawner] | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self._config = config
        self._output = output
        self.job_id = secrets.token_hex(6)
        self._started_at = time.time()
        self._telemetry = Telemetry.for_config(config, self.job_id)
        self._placement = Placement(config)
        self._spawner_for = spawner_for or self._placement.spawner_for
        self._base_env = dict(base_env) if base_env is not None else None
        self._registry = HostRegistry(config.blacklist_cooldown)
        self._watcher = HostWatcher(discovery, self._registry, config.discovery_interval,
                                    self._telemetry)
        operator = OperatorEndpoints(self._view, self._registry, self._watcher, self._telemetry)
        self._control = Control(operator, config.webhook_token, config.slots_per_host or 1)
        self._secret = protocol.new_secret()
        self._rendezvous = Rendezvous(self._secret, self)
        self._pool: WorkerPool | None = None
        self._round_number = 0
        self._assignment: Assignment = {}
        self._standbys: Standbys | None = None
        self._forming_round = False
        self._reset_requests: set[str] = set()
        self._failures = FailureLog(self._telemetry)
        self._planner = RoundPlanner(self._registry, self._rendezvous, config.max_np)
        self._finishing = False
        self._stopping = False
        self._tasks: set[asyncio.Task[Any]] = set()

    # --- lifecycle ----------------------------------------------------------------------
    async def run(self) -> int:
        """Runs the job to its end. Returns the exit code; raises ElasticrunError on failure."""
        loop = asyncio.get_running_loop()
        self._finished: asyncio.Future[int] = loop.create_future()
        self._reround = asyncio.Event()
        self._reround_changed = asyncio.Event()
        self._reround_at = 0.0
        self._hosts_changed = asyncio.Event()
        for sig, code in ((signal.SIGINT, EXIT_CODE_SIGINT), (signal.SIGTERM, EXIT_CODE_SIGTERM)):
            loop.add_signal_handler(sig, self._interrupted, sig, code)
        code = 1
        error: str | None = "internal error"
        try:
            await self._start()
            code = await self._finished
            error = None if code == 0 else f"interrupted (exit code {code})"
            return code
        except ElasticrunError as exc:
            error = str(exc)
            raise
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            self._telemetry.job_ended(code, error, self._round_number)
            await self._shutdown()

    async def _start(self) -> None:
        await self._watcher.first_poll()
        self._placement.set_hosts(list(self._registry.discovered))
        all_local = self._placement.all_local
        bind = self._config.bind
        dialed = [dial_address(bind, self._placement.address_for(host))
                  for host in ["localhost", *self._registry.discovered]]
        addresses = listen_addresses(bind, all_local, dialed)
        try:
            port = await self._rendezvous.start(addresses, self._config.port,
                                                self._control.routes())
        except OSError as exc:
            raise ConfigError(f"cannot listen on {', '.join(addresses)} port "
                              f"{self._config.port}: {exc.strerror or exc}") from None
        if (warning := wildcard_warning(addresses, port)) is not None:
            log.warning("%s", warning)
        advertised = dialed[0]
        log.info("job %s: status at http://%s:%d/status", self.job_id,
                 "127.0.0.1" if covered(addresses, "127.0.0.1") else advertised, port)
        self._telemetry.job_started(self._config, self._registry.discovered,
                                    self._watcher.describe())
        env_settings = EnvSettings(
            rendezvous_addr=advertised,
            rendezvous_port=port,
            secret=self._secret,
            collective_timeout=self._config.collective_timeout,
            round_timeout=self._config.start_timeout + self._config.elastic_timeout,
            driver_timeout=self._config.driver_timeout,
            gloo_interface=self._config.network_interface or ("lo" if all_local else None),
        )
        settings = PoolSettings(
            command=self._config.command,
            working_dir=self._config.working_dir,
            grace_period=self._config.stop_grace_period,
            env_settings=env_settings,
            base_env=self._base_env if self._base_env is not None else launcher_env(),
        )
        self._pool = WorkerPool(settings, self._spawner_for, self._dial_address,
                                self._output, self._on_worker_exit)
        self._planner.pool = self._pool
        self._rendezvous.hold_leaving_s = self._config.start_timeout + \
            self._config.collective_timeout
        self._standbys = Standbys(self._pool, self._rendezvous, self._placement,
                                  self._config.min_np, self._spawn)
        log.debug("driver server on %s port %d", ", ".join(addresses), port)
        await self._wait_for_start()
        self._run_task(self._round_manager())
        self._run_task(self._watcher.run(self._after_poll))
        self._request_reround(0.0)

    async def _shutdown(self) -> None:
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        if self._pool is not None:
            await self._pool.stop_all()
        await self._placement.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._rendezvous.stop()
        await self._telemetry.close()

    def _interrupted(self, sig: int, code: int) -> None:
        log.warning("received %s; stopping the job", signal.Signals(sig).name)
        self._finish(code)

    def _finish(self, code: int) -> None:
        if not self._finished.done():
            self._finished.set_result(code)

    def _fail(self, message: str) -> None:
        if not self._finished.done():
            self._finished.set_exception(JobFailedError(message))

    def _run_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                exc = t.exception()
                if isinstance(exc, ElasticrunError):
                    self._fail(str(exc))
                else:
                    log.error("internal error", exc_info=exc)
                    self._fail(f"internal error: {exc!r}")

        task.add_done_callback(done)

    # --- hosts ----------------------------------------------------------------------------

    async def _wait_for_start(self) -> None:
        config = self._config
        loop = asyncio.get_running_loop()
        deadline = loop.time() + config.start_timeout
        while True:
            available = sum(self._registry.usable(time.monotonic()).values())
            waited_out = loop.time() >= deadline
            refusal = start_refusal(config, available, self._registry, waited_out)
            if refusal is not None:
                raise JobFailedError(refusal)
            if available >= config.np or waited_out or not config.dynamic_hosts:
                return
            await self._watcher.wait_and_poll(
                min(config.discovery_interval, max(0.0, deadline - loop.time())))

    async def _after_poll(self) -> None:
        self._hosts_changed.set()
        await self._prepare_host_change()

    async def _prepare_host_change(self) -> None:
        """When the hosts would give a different round, gets it ready while training goes on."""
        if self._finishing or self._round_number == 0 or self._reround.is_set() \
                or self._forming_round or self._standbys is None:
            return
        await self._standbys.prepare(self._assignment, self._planner.desired(self._assignment))

    # --- rounds -----------------------------------------------------------------------------
    def _request_reround(self, delay: float) -> None:
        at = asyncio.get_running_loop().time() + delay
        if not self._reround.is_set() or at < self._reround_at:
            self._reround_at = at
            self._reround.set()
            self._reround_changed.set()

    async def _round_manager(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._reround.wait()
            while (remaining := self._reround_at - loop.time()) > 0:
                self._reround_changed.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._reround_changed.wait(), remaining)
            self._reround.clear()
            if self._finishing or self._finished.done():
                return
            self._forming_round = True
            try:
                await self._open_round()
            finally:
                self._forming_round = False

    async def _open_round(self) -> None:
        assignment = await self._wait_for_capacity()
        if assignment is None:
            return
        number = self._round_number + 1
        if self._planner.state_lost():
            # Survivors that finished a sync just before the failure may still have their
            # report on the way: give them a moment before calling the state lost.
            deadline = asyncio.get_running_loop().time() + SYNC_REPORT_GRACE_S
            while self._planner.state_lost() and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            assignment = self._planner.desired(self._assignment)
        if self._planner.state_lost():
            self._fail("no worker holding the committed training state is left (every one "
                       "was lost); a new round would silently start training from scratch, "
                       "so the job stops. Restart it (from your last disk checkpoint, if you "
                       f"keep one){self._failures.suffix()}")
            return
        limit = self._config.reset_limit
        if number > 1 and limit is not None and number - 1 > limit:
            self._fail(f"reset limit {limit} reached: another reset was needed"
                       f"{self._failures.suffix()}")
            return
        assert self._pool is not None
        members: dict[SlotId, str] = {}
        new_slots: list[SlotId] = []
        for slot in assignment:
            holder = self._pool.holder(slot)
            if holder is not None:
                members[slot] = holder.id
            else:
                members[slot] = new_worker_id(slot)
                new_slots.append(slot)
        self._round_number = number
        self._assignment = assignment
        assert self._standbys is not None
        self._standbys.round_opened()
        self._reset_requests.clear()
        self._rendezvous.open_round(number, assignment, members)
        self._telemetry.round_opened(number, assignment)
        self._watcher.wake(poll=False)  # host changes that came while this round was cut
        log.info("round %d: world size %d on %s%s", number, len(assignment),
                 format_hosts(_slots_per_host(assignment)),
                 f" ({len(new_slots)} new worker(s))" if number > 1 and new_slots else "")
        master = self._placement.master_endpoint(assignment)
        await asyncio.gather(*(self._spawn(slot, members[slot], assignment, master, False)
                               for slot in new_slots))

    async def _wait_for_capacity(self) -> Assignment | None:
        """The next round's assignment once --min-np slots exist; None if the job failed."""
        config = self._config
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while True:
            assignment = self._planner.desired(self._assignment)
            if len(assignment) >= config.min_np:
                return assignment
            now = time.monotonic()
            short = shortfall(config, len(assignment), self._registry, now)
            if short.hopeless is not None:
                self._fail(f"no progress possible: {short.hopeless}{self._failures.suffix()}")
                return None
            if deadline is None:
                deadline = loop.time() + config.elastic_timeout
                log.warning("waiting up to %gs (--elastic-timeout) for %d slot(s); %d available",
                            config.elastic_timeout, config.min_np, len(assignment))
            remaining = deadline - loop.time()
            if remaining <= 0:
                self._fail(f"elastic timeout: fewer than --min-np {config.min_np} slots for "
                           f"{config.elastic_timeout:g}s{self._failures.suffix()}")
                return None
            if short.wake_at is not None:
                remaining = min(remaining, max(0.01, short.wake_at - now))
            self._hosts_changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._hosts_changed.wait(), remaining)


    # --- workers ------------------------------------------------------------------------------
    async def _dial_address(self, host: str) -> str:
        """The driver's address for workers on `host`, listened on before they dial it."""
        address = dial_address(self._config.bind, self._placement.address_for(host))
        if not covered(self._rendezvous.listening, address):
            try:
                await self._rendezvous.listen(address)
            except OSError as exc:
                raise SpawnError(f"the driver cannot listen on {address} (the address host "
                                 f"{host} reaches it at): {exc.strerror or exc}") from None
            log.info("the driver now also listens on %s (for host %s)", address, host)
        return address

    async def _spawn(self, slot: SlotId, worker_id: str, assignment: Assignment,
                     master: tuple[str, int], standby: bool) -> None:
        assert self._pool is not None
        self._rendezvous.register_worker(worker_id, slot, standby=standby)
        try:
            await self._pool.spawn(worker_id, slot, assignment[slot], master)
        except SpawnError as exc:
            self._rendezvous.forget_worker(worker_id)
            if self._standbys is not None:
                self._standbys.forget(worker_id)
            self._failures.worker_failed(f"{exc} (on host {slot.host})", host=slot.host,
                                         kind="spawn_error")
            self._fail_host(slot.host, str(exc))
            return
        if self._stopping:
            self._pool.stop_host_slot(slot)
        elif standby:
            asyncio.get_running_loop().call_later(
                self._config.start_timeout, self._standby_expired, worker_id)

    def _on_worker_exit(self, worker: Worker, code: int) -> None:
        self._rendezvous.forget_worker(worker.id)
        if self._standbys is not None:
            self._standbys.forget(worker.id)
        if self._stopping or self._finished.done():
            return
        if worker.state in (WorkerState.RELEASED, WorkerState.STOPPING):
            log.debug("worker %s (%s) ended after being stopped or released", worker.slot,
                      describe_exit(code))
            self._finish_if_done()
            return
        if code == 0:
            worker.state = WorkerState.FINISHED
            if worker.id in self._current_members():
                self._finishing = True
            self._finish_if_done()
            return
        worker.state = WorkerState.FAILED
        cause = f"rank {worker.rank} on host {worker.slot.host} {describe_exit(code)}"
        self._failures.worker_failed(cause, host=worker.slot.host, kind=failure_cause(code),
                                     rank=worker.rank, exit_code=code,
                                     stderr_tail=worker.stderr_tail)
        if self._finishing:
            self._fail(f"{cause} after other workers had finished{self._failures.suffix()}")
            return
        self._fail_host(worker.slot.host, cause)

    def _current_members(self) -> set[str]:
        current = self._rendezvous.current_round
        return set(current.members.values()) if current else set()

    def _finish_if_done(self) -> None:
        members = self._current_members()
        assert self._pool is not None
        if members and all(
            (w := self._pool.get(wid)) is not None and w.state is WorkerState.FINISHED
            for wid in members
        ):
            log.info("all %d worker(s) of round %d finished", len(members), self._round_number)
            self._finish(0)

    def _fail_host(self, host: str, cause: str) -> None:
        """Blacklists `host` and stops its workers. If members of the current round ran
        there, the round is broken: its members are told, and a new round is cut."""
        assert self._pool is not None
        if self._registry.is_blacklisted(host, time.monotonic()):
            return  # already failed (its other workers report the same cause)
        now = time.monotonic()
        entry = self._registry.blacklist(host, now)
        cooldown = None if entry.until is None else entry.until - now
        until = "permanently" if cooldown is None else f"for {cooldown:.1f}s"
        log.warning("host %s failed (%s); blacklisted %s", host, cause, until)
        self._telemetry.host_blacklisted(host, cause, cooldown, entry.failures)
        if cooldown is not None:
            asyncio.get_running_loop().call_later(cooldown, self._cooldown_ended, host)
        current = self._rendezvous.current_round
        breaks_round = current is not None and any(slot.host == host for slot in current.members)
        self._pool.stop_host(host)
        if breaks_round or current is None:
            self._telemetry.round_broken()
            self._rendezvous.mark_broken(self._round_number)
            self._request_reround(FAILURE_COALESCE_S)

    # --- RendezvousListener ----------------------------------------------------------------------
    def barrier_started(self, round_number: int) -> None:
        loop = asyncio.get_running_loop()
        start = self._config.start_timeout
        loop.call_later(start, self._barrier_expired, round_number, start, False)
        # A worker that was already running needs no start-up: it rejoins as soon as its
        # collective fails, which takes at most the collective timeout. One that does not is
        # stuck (stopped, hung in user code) and is failed without waiting for the start timeout.
        rejoin = self._config.collective_timeout + REJOIN_SLACK_S
        if rejoin < start:
            loop.call_later(rejoin, self._barrier_expired, round_number, rejoin, True)

    def _barrier_expired(self, round_number: int, waited: float, survivors_only: bool) -> None:
        current = self._rendezvous.current_round
        if self._stopping or current is None or current.number != round_number or current.complete:
            return
        assert self._pool is not None
        for slot in current.missing():
            worker = self._pool.get(current.members[slot])
            if worker is None or not worker.alive or worker.state is not WorkerState.RUNNING:
                continue
            if survivors_only and worker.joined_round == 0:
                continue  # still starting up: the start timeout applies
            cause = (f"rank {current.assignment[slot].rank} on host {slot.host} did not join "
                     f"round {round_number} within {waited:g}s")
            self._failures.worker_failed(cause, host=slot.host, kind="check_in_timeout",
                                         rank=current.assignment[slot].rank,
                                         stderr_tail=worker.stderr_tail)
            self._fail_host(slot.host, cause)

    def reset_requested(self, worker_id: str, last_round: int) -> None:
        if self._finishing or last_round < self._round_number:
            return
        current = self._rendezvous.current_round
        self._reset_requests.add(worker_id)
        if current is not None and (self._rendezvous.notice_seq > current.notice_seq
                                    or set(current.members.values()) <= self._reset_requests):
            self._request_reround(0.0)
        else:
            self._request_reround(UNEXPLAINED_RESET_GRACE_S)

    def standby_ready(self, worker_id: str) -> None:
        if self._standbys is not None:
            self._standbys.checked_in(worker_id)

    def _standby_expired(self, worker_id: str) -> None:
        worker = self._pool.get(worker_id) if self._pool else None
        if self._standbys is not None and self._standbys.is_waiting(worker_id) \
                and worker is not None and worker.alive and not self._stopping:
            cause = (f"a new worker on host {worker.slot.host} did not check in within "
                     f"{self._config.start_timeout:g}s")
            self._failures.worker_failed(cause, host=worker.slot.host, kind="check_in_timeout",
                                         stderr_tail=worker.stderr_tail)
            self._fail_host(worker.slot.host, cause)

    def worker_released(self, worker_id: str) -> None:
        worker = self._pool.get(worker_id) if self._pool else None
        if worker is not None and worker.state is WorkerState.RUNNING:
            worker.state = WorkerState.RELEASED
            log.info("worker %s has no place in round %d; it exits", worker.slot,
                     self._round_number)

    def worker_synced(self, worker_id: str, round_number: int) -> None:
        if self._planner.worker_synced(worker_id, round_number):
            self._watcher.wake(poll=False)  # a handover may complete now

    def round_completed(self, round_number: int) -> None:
        self._telemetry.round_completed(round_number)

    def _cooldown_ended(self, host: str) -> None:
        if self._stopping or self._registry.is_blacklisted(host, time.monotonic()):
            return  # failed again meanwhile: a later timer restores it
        log.info("host %s: blacklist cooldown ended", host)
        self._telemetry.host_restored(host)
        self._hosts_changed.set()
        self._watcher.wake(poll=False)

    # --- what /status and /metrics show ------------------------------------------------------
    def _view(self) -> JobView:
        current = self._rendezvous.current_round
        if self._stopping or self._finished.done():
            state = "stopped"
        elif self._finishing:
            state = "finishing"
        elif current is None:
            state = "starting"
        elif self._reround.is_set() or self._forming_round:
            state = "recovering"
        else:
            state = "running"
        standby = self._standbys.hosts() if self._standbys is not None else frozenset()
        return JobView(
            job_id=self.job_id, state=state, now=time.monotonic(), wall_now=time.time(),
            started_at=self._started_at, round=self._round_number,
            round_complete=bool(current and current.complete),
            assignment=dict(self._assignment), standby_hosts=standby,
            discovered=self._registry.discovered, drained=frozenset(self._registry.drained),
            blacklist=self._registry.blacklist_snapshot(), np=self._config.np,
            min_np=self._config.min_np, max_np=self._config.max_np,
            reset_limit=self._config.reset_limit, discovery=self._watcher.describe(),
            discovery_error=self._watcher.last_error)

    def worker_joined(self, worker_id: str, round_number: int, rank: int) -> None:
        worker = self._pool.get(worker_id) if self._pool else None
        if worker is not None:
            worker.rank = rank
            worker.joined_round = round_number


def _slots_per_host(assignment: Assignment) -> HostSlots:
    counts: HostSlots = {}
    for slot in sorted(assignment, key=lambda s: assignment[s].rank):
        counts[slot.host] = counts.get(slot.host, 0) + 1
    return counts





