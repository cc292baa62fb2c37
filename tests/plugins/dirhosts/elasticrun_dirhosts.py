"""`--discovery dirhosts:DIR`: every file in DIR is a host; its name is the host, its content
the slots. Hosts are ordered by the time their file appeared (oldest first)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class DirectoryDiscovery:
    def __init__(self, directory: Path) -> None:
        self._directory = directory

    async def find_hosts(self) -> dict[str, int]:
        from elasticrun.job.errors import DiscoveryError

        try:
            files = sorted(self._directory.iterdir(), key=lambda p: (p.stat().st_mtime_ns, p.name))
            return {p.name: int(p.read_text().strip() or "1") for p in files if p.is_file()}
        except (OSError, ValueError) as exc:
            raise DiscoveryError(f"dirhosts {self._directory}: {exc}") from None

    def describe(self) -> str:
        return f"dirhosts {self._directory}"


def make(options: Any) -> DirectoryDiscovery:
    if not options.arg:
        raise ValueError("expected dirhosts:DIRECTORY")
    return DirectoryDiscovery(Path(options.arg))
