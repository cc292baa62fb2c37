"""The host registry: what discovery says, which hosts are blacklisted or drained, and until when.

Pure state and policy; the driver feeds it discovery results and failures, and the
clock is passed in so that the cooldown policy is testable.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from elasticrun.discovery.base import HostSlots


@dataclass
class BlacklistEntry:
    failures: int
    until: float | None  # None: permanent


def cooldown_delay(cooldown_range: tuple[float, float], failures: int, jitter: float) -> float:
    """Horovod Elastic's schedule (HostState._set_cooldown_period in
    horovod/runner/elastic/discovery.py): MIN * 2**failures + jitter * MIN, with jitter
    uniform in [0, 1), clipped to [MIN, MAX]. With MIN 1 and MAX 2 the first cooldown is 2 s."""
    low, high = cooldown_range
    return max(low, min(high, low * 2 ** failures + jitter * low))


class HostRegistry:
    def __init__(
        self,
        cooldown_range: tuple[float, float] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._discovered: HostSlots = {}
        self._blacklist: dict[str, BlacklistEntry] = {}
        self._drained: set[str] = set()
        self._cooldown_range = cooldown_range
        self._rng = rng or random.Random()

    @property
    def discovered(self) -> HostSlots:
        return dict(self._discovered)

    @property
    def drained(self) -> set[str]:
        return set(self._drained)

    def update(self, hosts: HostSlots) -> None:
        """A drained host that discovery no longer lists is forgotten as drained: if it is
        listed again later, it is a new machine under an old name."""
        self._discovered = dict(hosts)
        self._drained &= set(hosts)

    def drain(self, host: str) -> None:
        """Takes a host out of use (its workers leave at the next commit) while discovery
        may still list it, e.g. a spot instance that got its termination notice."""
        if host in self._discovered:
            self._drained.add(host)

    def undrain(self, host: str) -> None:
        self._drained.discard(host)

    def blacklist(self, host: str, now: float) -> BlacklistEntry:
        """Marks a host failed. With a cooldown range it may return after
        cooldown_delay(); without one it never returns."""
        previous = self._blacklist.get(host)
        failures = previous.failures + 1 if previous else 1
        until: float | None = None
        if self._cooldown_range is not None:
            until = now + cooldown_delay(self._cooldown_range, failures, self._rng.uniform(0, 1))
        entry = BlacklistEntry(failures, until)
        self._blacklist[host] = entry
        return entry

    def give_back(self, host: str) -> None:
        """Ends a host's blacklisting now; its count of failures is kept (a cooldown after
        its next failure is longer)."""
        entry = self._blacklist.get(host)
        if entry is not None:
            self._blacklist[host] = BlacklistEntry(entry.failures, 0.0)

    def is_blacklisted(self, host: str, now: float) -> bool:
        entry = self._blacklist.get(host)
        return entry is not None and (entry.until is None or entry.until > now)

    def blacklist_snapshot(self) -> dict[str, BlacklistEntry]:
        return dict(self._blacklist)

    def restore(self, discovered: HostSlots, blacklist: dict[str, BlacklistEntry],
                drained: set[str]) -> None:
        """Takes back what a journal kept (a resumed driver): hosts, failures, drains."""
        self._discovered = dict(discovered)
        self._blacklist = dict(blacklist)
        self._drained = set(drained) & set(discovered)

    def usable(self, now: float) -> HostSlots:
        """Discovered hosts with slots, neither blacklisted now nor drained, in discovery order."""
        return {
            host: slots
            for host, slots in self._discovered.items()
            if slots > 0 and not self.is_blacklisted(host, now) and host not in self._drained
        }

    def next_cooldown_end(self, now: float) -> float | None:
        """When the earliest blacklisted, discovered host comes back; None if none will."""
        ends = [
            entry.until
            for host, entry in self._blacklist.items()
            if entry.until is not None and entry.until > now and host in self._discovered
        ]
        return min(ends) if ends else None
