"""A hostfile, re-read on every poll so that editing it changes the job's hosts."""

from __future__ import annotations

from pathlib import Path

from elasticrun.discovery.base import HostSlots
from elasticrun.discovery.parsing import parse_host_lines
from elasticrun.errors import DiscoveryError


class HostfileDiscovery:
    def __init__(self, path: Path, default_slots: int) -> None:
        self._path = path
        self._default_slots = default_slots

    async def find_hosts(self) -> HostSlots:
        try:
            text = self._path.read_text()
        except OSError as exc:
            raise DiscoveryError(f"hostfile {self._path}: cannot read: {exc.strerror}") from None
        return parse_host_lines(text, self._default_slots, f"hostfile {self._path}")

    def describe(self) -> str:
        return f"hostfile {self._path}"
