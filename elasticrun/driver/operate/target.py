"""What the operator endpoints (routes.py) read and change: the job's OperatorTarget.

Reads come from the round machine's state; changes go to it as events (a drain) or to
the discovery source (a pushed host list), never around it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from elasticrun.discovery.base import HostSlots
from elasticrun.driver.hosts.watcher import HostWatcher
from elasticrun.driver.operate.flash_cadence import FlashCadences
from elasticrun.driver.operate.status import JobView, build_status, count_states, host_states
from elasticrun.driver.operate.telemetry import Telemetry
from elasticrun.driver.rounds import stragglers
from elasticrun.driver.rounds.events import Event, HostsAdded, HostsDrained
from elasticrun.driver.rounds.state import JobState
from elasticrun.job.config import DriverConfig


@dataclass
class JobOperator:
    job_id: str
    started_at: float  # wall-clock
    config: DriverConfig
    state: JobState
    watcher: HostWatcher
    telemetry: Telemetry
    post: Callable[[Event], None]
    epoch: int = 1
    flash: FlashCadences = field(default_factory=FlashCadences)

    def view(self) -> JobView:
        state = self.state
        current = state.round
        standby = frozenset(w.slot.host for wid in state.growth.ids
                            if (w := state.workers.get(wid)) is not None)
        config = self.config
        return JobView(
            job_id=self.job_id, state=state.phase.value, now=time.monotonic(),
            wall_now=time.time(), started_at=self.started_at, round=state.round_number,
            round_complete=bool(current and current.complete),
            assignment=dict(state.assignment), standby_hosts=standby,
            discovered=state.hosts.discovered, drained=frozenset(state.hosts.drained),
            blacklist=state.hosts.blacklist_snapshot(),
            slot_blacklist=state.hosts.slot_blacklist_snapshot(), np=config.np,
            min_np=config.min_np, max_np=config.max_np, reset_limit=config.reset_limit,
            discovery=self.watcher.describe(), discovery_error=self.watcher.last_error,
            epoch=self.epoch, restarts=state.restarts,
            last_restore=self.telemetry.last_restore,
            flash_commits=self.flash.summary(
                {wid for wid, worker in state.workers.items() if worker.alive}),
            stragglers={"mode": config.stragglers, "members": stragglers.pace_view(state)})

    def status(self) -> dict[str, Any]:
        return build_status(self.view())

    def metrics(self) -> bytes:
        self.telemetry.refresh(count_states(host_states(self.view())))
        return self.telemetry.metrics.render()

    def hosts_view(self) -> dict[str, Any]:
        return {"hosts": self.state.hosts.discovered, "drained": sorted(self.state.hosts.drained),
                "source": self.watcher.describe()}

    def push_hosts(self, action: str, hosts: HostSlots) -> dict[str, Any]:
        """Raises PushRefused (from the watcher) when the push cannot be applied."""
        if action == "drain":
            registry = self.state.hosts
            unknown = [h for h in hosts if h not in registry.discovered]
            drained = [h for h in hosts if h not in unknown and h not in registry.drained]
            self.post(HostsDrained(tuple(drained)))
            return {"drained": drained, "unknown": unknown}
        result = self.watcher.push(action, hosts)
        if action == "add":
            self.post(HostsAdded(tuple(hosts)))
        return result
