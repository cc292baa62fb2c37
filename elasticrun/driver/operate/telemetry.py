"""What the driver reports about a job: events (webhooks, the event log) and metrics.

The driver says what happened, once, here; this module turns it into an event for the
event sinks and into counters, gauges and timings for /metrics.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from elasticrun.discovery.base import HostSlots
from elasticrun.driver.operate.metrics import DriverMetrics
from elasticrun.driver.operate.sinks import EventBus, EventSink, JsonLinesSink
from elasticrun.driver.operate.webhook_sink import WebhookSink
from elasticrun.driver.rounds.assignment import Assignment
from elasticrun.job.config import DriverConfig
from elasticrun.system.outsiders import Outsiders


class Telemetry:
    def __init__(self, job_id: str, sinks: Iterable[EventSink] = ()) -> None:
        self.last_restore: dict[str, Any] | None = None  # for /status
        self.job_id = job_id
        self.metrics = DriverMetrics()
        # requests refused because of their sender: the server's parts count them here
        self.outsiders = Outsiders(self.metrics.refused_requests)
        self._sinks = list(sinks)
        self._bus = EventBus(job_id, self._sinks)
        self._round_opened_at: dict[int, float] = {}
        self._failure_at: float | None = None

    @classmethod
    def for_config(cls, config: DriverConfig, job_id: str) -> Telemetry:
        sinks: list[EventSink] = []
        if config.event_log is not None:
            sinks.append(JsonLinesSink(config.event_log))
        for url in config.event_webhooks:
            assert config.event_key is not None  # the config refuses webhooks without a key
            sinks.append(WebhookSink(url, config.event_key))
        return cls(job_id, sinks)

    # --- the job -------------------------------------------------------------------------
    def job_started(self, config: DriverConfig, hosts: HostSlots, discovery: str) -> None:
        self._bus.emit("job_started", np=config.np, min_np=config.min_np,
                       max_np=config.max_np, hosts=dict(hosts), discovery=discovery,
                       command=list(config.command))

    def job_ended(self, exit_code: int, error: str | None, rounds: int) -> None:
        if exit_code == 0 and error is None:
            self._bus.emit("job_finished", exit_code=0, rounds=rounds,
                           resets=max(0, rounds - 1))
        else:
            self._bus.emit("job_failed", exit_code=exit_code, error=error, rounds=rounds,
                           resets=max(0, rounds - 1))

    def driver_resumed(self, epoch: int, readopted: int, expected: int,
                       seconds: float) -> None:
        self._bus.emit("driver_resumed", epoch=epoch, readopted=readopted, expected=expected,
                       seconds=round(seconds, 3))

    async def close(self, timeout: float = 2.0) -> None:
        self.outsiders.flush()  # what was held back since its last line
        await self._bus.close(timeout)

    # --- rounds ------------------------------------------------------------------------
    def round_opened(self, number: int, assignment: Assignment) -> None:
        self.metrics.rounds.inc()
        if number > 1:
            self.metrics.resets.inc()
        self.metrics.round.set(number)
        self.metrics.world_size.set(len(assignment))
        self._round_opened_at[number] = time.monotonic()
        ordered = sorted(assignment.items(), key=lambda item: item[1].rank)
        members = [{"rank": info.rank, "host": slot.host, "local_rank": info.local_rank}
                   for slot, info in ordered]
        hosts: HostSlots = {}
        for slot, _ in ordered:
            hosts[slot.host] = hosts.get(slot.host, 0) + 1
        self._bus.emit("round_started", round=number, world_size=len(assignment),
                       hosts=hosts, members=members)

    def round_completed(self, number: int) -> None:
        now = time.monotonic()
        opened = self._round_opened_at.pop(number, None)
        if opened is not None:
            self.metrics.rendezvous_seconds.observe(now - opened)
        if self._failure_at is not None:
            self.metrics.recovery_seconds.observe(now - self._failure_at)
            self._failure_at = None

    def round_restarting(self, count: int, cause: str) -> None:
        """A round of scripts that never call er.init() is stopped to start over: after a
        failure (`cause`; counted) or for a host change (no cause)."""
        if cause:
            self.metrics.restarts.inc()
        self._bus.emit("round_restarting", restart_count=count, cause=cause or None)

    def total_loss(self, cause: str, restarts: int, hosts: list[str]) -> None:
        """Every worker holding the commit was lost: the job restarts from the kept one."""
        self.metrics.restarts.inc()
        self._bus.emit("total_loss", cause=cause, restart_count=restarts, hosts_given_back=hosts)

    def state_restored(self, round: int, commit: int, source: str) -> None:
        """A round restored a kept commit (a host snapshot, --checkpoint-dir)."""
        self.last_restore = {"round": round, "commit": commit, "source": source}
        self._bus.emit("state_restored", round=round, commit=commit, source=source)

    # --- failures ----------------------------------------------------------------------
    def worker_failed(self, *, rank: int | None, host: str, exit_code: int | None,
                      cause: str, cause_label: str, stderr_tail: Iterable[str] = ()) -> None:
        self.metrics.worker_failures.labels(cause_label).inc()
        self._bus.emit("worker_failed", rank=rank, host=host, exit_code=exit_code,
                       cause=cause, kind=cause_label, stderr_tail=list(stderr_tail))

    def round_broken(self) -> None:
        """A failure broke the current round: recovery time runs from now."""
        if self._failure_at is None:
            self._failure_at = time.monotonic()

    # --- hosts -------------------------------------------------------------------------
    def hosts_changed(self, old: HostSlots, new: HostSlots) -> None:
        for host, slots in new.items():
            if old.get(host) != slots:
                self._bus.emit("host_added", host=host, slots=slots,
                               previous_slots=old.get(host))
        for host in old:
            if host not in new:
                self._bus.emit("host_removed", host=host)

    def host_drained(self, host: str) -> None:
        self._bus.emit("host_drained", host=host)

    def host_blacklisted(self, host: str, cause: str, cooldown_s: float | None,
                         failures: int) -> None:
        self.metrics.hosts_blacklisted.inc()
        self._bus.emit("host_blacklisted", host=host, cause=cause, cooldown_s=cooldown_s,
                       failures=failures)

    def host_restored(self, host: str) -> None:
        self._bus.emit("host_restored", host=host)

    def slot_blacklisted(self, host: str, slot: int, cause: str, cooldown_s: float | None,
                         failures: int) -> None:
        self.metrics.slots_blacklisted.inc()
        self._bus.emit("slot_blacklisted", host=host, slot=slot, cause=cause,
                       cooldown_s=cooldown_s, failures=failures)

    def slot_restored(self, host: str, slot: int) -> None:
        self._bus.emit("slot_restored", host=host, slot=slot)

    # --- stragglers (driver/rounds/stragglers.py) --------------------------------------
    def worker_slowdowns(self, slowdowns: list[tuple[int, str, float]]) -> None:
        """Each member's slowdown against its peers at the latest tick (1.0: keeps pace)."""
        gauge = self.metrics.worker_slowdown
        gauge.clear()  # (the ranks of a new round replace the last one's)
        for rank, host, slowdown in slowdowns:
            gauge.labels(str(rank), host).set(slowdown)

    def straggler(self, rank: int, host: str, slowdown: float, action: str, reason: str,
                  projected_gain: float) -> None:
        self.metrics.stragglers.labels(action).inc()
        self._bus.emit("straggler", rank=rank, host=host, slowdown=slowdown, action=action,
                       reason=reason, projected_gain=projected_gain)

    def straggler_cleared(self, rank: int, host: str, slowdown: float) -> None:
        self._bus.emit("straggler_cleared", rank=rank, host=host, slowdown=slowdown)

    def discovery_polled(self, seconds: float, failed: bool) -> None:
        self.metrics.discovery_seconds.observe(seconds)
        if failed:
            self.metrics.discovery_errors.inc()

    def refresh(self, host_states: dict[str, int]) -> None:
        """Updates the gauges that are read at scrape time."""
        self.metrics.set_host_states(host_states)
        self.metrics.events_dropped.set(
            sum(getattr(sink, "dropped", 0) for sink in self._sinks))
