"""The host registry: what discovery says, which hosts are blacklisted or drained, which
slots of a host are left out, and until when.

Pure state and policy; the driver feeds it discovery results and failures, and the
clock is passed in so that the cooldown policy is testable. Who is left out, and when, is
decided elsewhere (driver/rounds/evidence.py); this keeps the verdicts and their cooldowns.
A slot is (host, index): the index is the slot's local rank on its host (one GPU).
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
        self._slot_blacklist: dict[tuple[str, int], BlacklistEntry] = {}  # slots, by (host, index)
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
        entry = self._next_entry(self._blacklist.get(host), now)
        self._blacklist[host] = entry
        return entry

    def blacklist_slot(self, host: str, index: int, now: float) -> BlacklistEntry:
        """Leaves one slot of a host out (its host's other slots stay in use), with the
        hosts' cooldown policy."""
        entry = self._next_entry(self._slot_blacklist.get((host, index)), now)
        self._slot_blacklist[(host, index)] = entry
        return entry

    def _next_entry(self, previous: BlacklistEntry | None, now: float) -> BlacklistEntry:
        failures = previous.failures + 1 if previous else 1
        until: float | None = None
        if self._cooldown_range is not None:
            until = now + cooldown_delay(self._cooldown_range, failures, self._rng.uniform(0, 1))
        return BlacklistEntry(failures, until)

    def give_back(self, host: str) -> None:
        """Ends a host's blacklisting now, and its slots' leaving out; the counts of failures
        are kept (a cooldown after the next failure is longer)."""
        entry = self._blacklist.get(host)
        if entry is not None:
            self._blacklist[host] = BlacklistEntry(entry.failures, 0.0)
        for (slot_host, index), left in self._slot_blacklist.items():
            if slot_host == host:
                self._slot_blacklist[(slot_host, index)] = BlacklistEntry(left.failures, 0.0)

    def is_blacklisted(self, host: str, now: float) -> bool:
        return _in_force(self._blacklist.get(host), now)

    def slot_blacklisted(self, host: str, index: int, now: float) -> bool:
        """Whether the slot is out of use: blacklisted itself, or its host."""
        return _in_force(self._slot_blacklist.get((host, index)), now) \
            or self.is_blacklisted(host, now)

    def holds_out(self, host: str, now: float) -> bool:
        """Whether the host, or any slot of it, is blacklisted now."""
        return self.is_blacklisted(host, now) or any(
            slot_host == host and _in_force(entry, now)
            for (slot_host, _), entry in self._slot_blacklist.items())

    def blacklist_snapshot(self) -> dict[str, BlacklistEntry]:
        return dict(self._blacklist)

    def slot_blacklist_snapshot(self) -> dict[tuple[str, int], BlacklistEntry]:
        return dict(self._slot_blacklist)

    def restore(self, discovered: HostSlots, blacklist: dict[str, BlacklistEntry],
                drained: set[str],
                slot_blacklist: dict[tuple[str, int], BlacklistEntry] | None = None) -> None:
        """Takes back what a journal kept (a resumed driver): hosts, failures, drains."""
        self._discovered = dict(discovered)
        self._blacklist = dict(blacklist)
        self._drained = set(drained) & set(discovered)
        self._slot_blacklist = dict(slot_blacklist or {})

    def usable(self, now: float) -> HostSlots:
        """Discovered hosts with slots, neither blacklisted now nor drained, in discovery order."""
        return {
            host: slots
            for host, slots in self._discovered.items()
            if slots > 0 and not self.is_blacklisted(host, now) and host not in self._drained
        }

    def usable_slots(self, now: float) -> dict[str, tuple[int, ...]]:
        """usable(), slot by slot: each host's slot indices that are not left out."""
        return {host: indices for host, slots in self.usable(now).items()
                if (indices := tuple(i for i in range(slots)
                                     if not _in_force(self._slot_blacklist.get((host, i)), now)))}

    def next_cooldown_end(self, now: float) -> float | None:
        """When the earliest blacklisted, discovered host (or left-out slot of one) comes
        back; None if none will."""
        entries = [*self._blacklist.items(),
                   *(((host, entry) for (host, _), entry in self._slot_blacklist.items()))]
        ends = [
            entry.until
            for host, entry in entries
            if entry.until is not None and entry.until > now and host in self._discovered
        ]
        return min(ends) if ends else None


def _in_force(entry: BlacklistEntry | None, now: float) -> bool:
    return entry is not None and (entry.until is None or entry.until > now)
