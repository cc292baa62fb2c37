"""The default launcher: this machine's own names and loopback addresses run as local
subprocesses, every other host is reached over SSH."""

from __future__ import annotations

from elasticrun.config import DriverConfig
from elasticrun.launch.base import Launcher, WorkerProcess, WorkerSpec, is_local_host, local_names
from elasticrun.launch.local import LocalLauncher
from elasticrun.launch.local_agents import local_launcher
from elasticrun.launch.plugins import LaunchOptions, no_arg
from elasticrun.launch.ssh import SSHLauncher, SSHSettings


class AutoLauncher:
    def __init__(self, config: DriverConfig, local: Launcher | None = None) -> None:
        self._config = config
        self._local_names = local_names()
        self._local = local or LocalLauncher()
        self._ssh: SSHLauncher | None = None

    def serving(self, port: int) -> None:
        serving = getattr(self._local, "serving", None)
        if serving is not None:
            serving(port)

    def outlives_driver(self, host: str) -> bool:
        """This machine's workers may (under the job's own agents); SSH ones end with it."""
        outlives = getattr(self._local, "outlives_driver", None)
        return is_local_host(host, self._local_names) and outlives is not None \
            and bool(outlives(host))

    def driver_address(self, host: str) -> str | None:
        address = getattr(self._local, "driver_address", None)
        return address(host) if address is not None else None

    async def start(self, spec: WorkerSpec) -> WorkerProcess:
        if is_local_host(spec.host, self._local_names):
            return await self._local.start(spec)
        if self._ssh is None:  # only jobs with remote hosts load SSH keys and config
            self._ssh = SSHLauncher(SSHSettings.from_config(self._config))
        return await self._ssh.start(spec)

    async def close(self) -> None:
        await self._local.close()
        if self._ssh is not None:
            await self._ssh.close()




def plugin(options: LaunchOptions) -> AutoLauncher:
    no_arg(options, "auto")
    return AutoLauncher(options.config, local_launcher(options))
