"""A hostfile, re-read whenever it changes, so that editing it changes the job's hosts."""

from __future__ import annotations

from pathlib import Path

from elasticrun.discovery.base import HostSlots
from elasticrun.discovery.parsing import parse_host_lines
from elasticrun.discovery.plugins import DiscoveryOptions
from elasticrun.job.errors import ConfigError, DiscoveryError


class HostfileDiscovery:
    def __init__(self, path: Path, default_slots: int) -> None:
        self._path = path
        self._default_slots = default_slots
        self._seen: tuple[int, int, int] | None = None  # (inode, mtime_ns, size) last parsed
        self._hosts: HostSlots = {}

    async def find_hosts(self) -> HostSlots:
        name = f"hostfile {self._path}"
        try:
            stat = self._path.stat()
            version = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if version != self._seen:
                text = self._path.read_text()
                self._hosts = parse_host_lines(text, self._default_slots, name)
                self._seen = version
        except OSError as exc:
            raise DiscoveryError(f"{name}: cannot read: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise DiscoveryError(f"{name}: not UTF-8 text") from None
        return dict(self._hosts)

    def describe(self) -> str:
        return f"hostfile {self._path}"


def plugin(options: DiscoveryOptions) -> HostfileDiscovery:
    """`--discovery hostfile:PATH`."""
    if not options.arg:
        raise ConfigError("expected hostfile:PATH")
    return HostfileDiscovery(Path(options.arg), options.slots_per_host)
