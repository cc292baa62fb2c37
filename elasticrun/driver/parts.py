"""What a driver runs besides its settings: the job's pluggable parts (built by
api/job_config.py from the settings)."""

from __future__ import annotations

from dataclasses import dataclass

from elasticrun.discovery import HostDiscovery
from elasticrun.launch.agents.hub import AgentHub
from elasticrun.launch.base import Launcher


@dataclass(frozen=True)
class JobParts:
    """The pluggable parts of one job: where hosts come from, how workers start, and the
    agents' hub when agents connect to this job."""

    discovery: HostDiscovery
    launcher: Launcher
    agents: AgentHub | None
