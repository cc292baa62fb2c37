"""The default launcher: this machine's own names and loopback addresses run as local
subprocesses, every other host is reached over SSH (with --state-dir, both under agents of
the job's own: launch/agents/job_agents.py)."""

from __future__ import annotations

from elasticrun.launch.base import Launcher, WorkerProcess, WorkerSpec, is_local_host, local_names
from elasticrun.launch.local.agents import local_launcher
from elasticrun.launch.plugins import LaunchOptions, no_arg
from elasticrun.launch.ssh.agents import ssh_launcher


class AutoLauncher:
    def __init__(self, local: Launcher, remote: Launcher) -> None:
        self._local_names = local_names()
        self._local = local
        self._remote = remote  # only jobs with remote hosts load SSH keys and config

    def _for(self, host: str) -> Launcher:
        return self._local if is_local_host(host, self._local_names) else self._remote

    def serving(self, port: int) -> None:
        for launcher in (self._local, self._remote):
            serving = getattr(launcher, "serving", None)
            if serving is not None:
                serving(port)

    def outlives_driver(self, host: str) -> bool:
        outlives = getattr(self._for(host), "outlives_driver", None)
        return outlives is not None and bool(outlives(host))

    def driver_address(self, host: str) -> str | None:
        address = getattr(self._for(host), "driver_address", None)
        return address(host) if address is not None else None

    async def start(self, spec: WorkerSpec) -> WorkerProcess:
        return await self._for(spec.host).start(spec)

    async def close(self) -> None:
        try:
            await self._local.close()
        finally:
            await self._remote.close()


def plugin(options: LaunchOptions) -> AutoLauncher:
    no_arg(options, "auto")
    return AutoLauncher(local_launcher(options), ssh_launcher(options))
