"""An example launcher plugin: `--launcher prefix:CMD` runs each worker on this machine with
CMD in front of its command (e.g. `prefix:nice -n 10`, `prefix:taskset -c 0-3`,
`prefix:env VAR=1`). It shows the whole plugin API: a factory taking LaunchOptions and an
object with `start(spec)` and `close()`; here the work is delegated to the local launcher."""

from __future__ import annotations

import dataclasses
import shlex

from elasticrun.job.errors import ConfigError
from elasticrun.launch.base import WorkerProcess, WorkerSpec
from elasticrun.launch.local.launcher import LocalLauncher
from elasticrun.launch.plugins import LaunchOptions


class PrefixLauncher:
    def __init__(self, prefix: list[str]) -> None:
        self._prefix = prefix
        self._local = LocalLauncher()

    async def start(self, spec: WorkerSpec) -> WorkerProcess:
        wrapped = dataclasses.replace(spec, command=(*self._prefix, *spec.command))
        return await self._local.start(wrapped)

    async def close(self) -> None:
        await self._local.close()


def make(options: LaunchOptions) -> PrefixLauncher:
    if not options.arg:
        raise ConfigError("expected prefix:COMMAND, e.g. prefix:nice -n 10")
    return PrefixLauncher(shlex.split(options.arg))
