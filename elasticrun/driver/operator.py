"""What the operator endpoints (control.py) read and change: the driver's ControlTarget."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from elasticrun.discovery.base import HostSlots
from elasticrun.driver.hosts import HostRegistry
from elasticrun.driver.hostwatch import HostWatcher
from elasticrun.driver.status import JobView, build_status, count_states, host_states
from elasticrun.driver.telemetry import Telemetry


class OperatorEndpoints:
    def __init__(self, view: Callable[[], JobView], registry: HostRegistry,
                 watcher: HostWatcher, telemetry: Telemetry) -> None:
        self._view = view
        self._registry = registry
        self._watcher = watcher
        self._telemetry = telemetry

    def status(self) -> dict[str, Any]:
        return build_status(self._view())

    def metrics(self) -> bytes:
        self._telemetry.refresh(count_states(host_states(self._view())))
        return self._telemetry.metrics.render()

    def hosts_view(self) -> dict[str, Any]:
        return {"hosts": self._registry.discovered, "drained": sorted(self._registry.drained),
                "source": self._watcher.describe()}

    def push_hosts(self, action: str, hosts: HostSlots) -> dict[str, Any]:
        return self._watcher.push(action, hosts)
