"""A discovery script: an executable that prints the current hosts, one per line."""

from __future__ import annotations

import os
from pathlib import Path

from elasticrun.discovery.base import HostSlots
from elasticrun.discovery.commands import run_command
from elasticrun.discovery.parsing import parse_host_lines
from elasticrun.discovery.plugins import DiscoveryOptions
from elasticrun.job.errors import ConfigError, DiscoveryError


class ScriptDiscovery:
    def __init__(self, path: Path, default_slots: int, timeout: float) -> None:
        self._path = path
        self._default_slots = default_slots
        self._timeout = timeout

    def describe(self) -> str:
        return f"discovery script {self._path}"

    def check(self) -> None:
        """Fails early, with one line, when the script cannot possibly run."""
        name = f"discovery script {self._path}"
        if not self._path.exists():
            raise DiscoveryError(f"{name}: no such file")
        if self._path.is_dir():
            raise DiscoveryError(f"{name}: is a directory, expected an executable file")
        if not os.access(self._path, os.X_OK):
            raise DiscoveryError(f"{name}: not executable (try: chmod +x {self._path})")

    async def find_hosts(self) -> HostSlots:
        self.check()
        name = f"discovery script {self._path}"
        text = await run_command([str(self._path.resolve())], self._timeout, name)
        return parse_host_lines(text, self._default_slots, name)


def plugin(options: DiscoveryOptions) -> ScriptDiscovery:
    """`--discovery script:PATH`."""
    if not options.arg:
        raise ConfigError("expected script:PATH")
    script = ScriptDiscovery(Path(options.arg), options.slots_per_host, options.timeout)
    script.check()
    return script
