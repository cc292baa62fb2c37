"""Pure assignment: ordered hosts with slots -> ranks, stable across rounds.

Ranks are filled host by host in host order. Hosts that held workers in the last
round come first, in their old order, and new hosts are appended, so the oldest
surviving host holds rank 0 and rank 0 always has the committed state.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from elasticrun.protocol import SlotInfo


@dataclass(frozen=True, order=True)
class SlotId:
    """A place for one worker: a host and the index of the slot on it (its local rank)."""

    host: str
    index: int

    def __str__(self) -> str:
        return f"{self.host}[{self.index}]"


Assignment = dict[SlotId, SlotInfo]


def order_hosts(previous: Sequence[str], available: Iterable[str]) -> list[str]:
    """Hosts of the previous round first (keeping their order), then the rest as given."""
    available = list(available)
    present = set(available)
    kept = [host for host in previous if host in present]
    kept_set = set(kept)
    return kept + [host for host in available if host not in kept_set]


HostSlotList = Sequence[tuple[str, int | Sequence[int]]]


def slot_indices(slots: int | Sequence[int]) -> tuple[int, ...]:
    """A host's usable slots: a count (slots 0..n-1) or the indices themselves."""
    return tuple(range(max(slots, 0))) if isinstance(slots, int) else tuple(slots)


def assign(hosts: HostSlotList, max_size: int | None = None) -> Assignment:
    """Gives ranks host by host; at most `max_size` slots in all. A host gives a count of
    slots (0..n-1) or the indices of its usable slots (some may be left out: evidence.py);
    hosts with none get none. A slot's index is its local rank, whatever is left out, so a
    worker's local rank (its GPU) never changes."""
    per_host: list[tuple[str, tuple[int, ...]]] = []
    remaining = max_size if max_size is not None else sum(len(slot_indices(s)) for _, s in hosts)
    for host, slots in hosts:
        take = slot_indices(slots)[:max(remaining, 0)]
        if take:
            per_host.append((host, take))
            remaining -= len(take)
    size = sum(len(take) for _, take in per_host)
    result: Assignment = {}
    rank = 0
    for host, take in per_host:
        for local_rank in take:
            peers = [h for h, t in per_host if local_rank in t]
            result[SlotId(host, local_rank)] = SlotInfo(
                hostname=host,
                rank=rank,
                size=size,
                local_rank=local_rank,
                local_size=len(take),
                cross_rank=peers.index(host),
                cross_size=len(peers),
            )
            rank += 1
    return result


def hosts_in_rank_order(assignment: Assignment) -> list[str]:
    ordered = sorted(assignment.items(), key=lambda item: item[1].rank)
    return list(dict.fromkeys(slot.host for slot, _ in ordered))


def assign_keeping_state(hosts: HostSlotList, max_size: int | None,
                         holders: Sequence[SlotId],
                         keepers: Sequence[SlotId] | None = None, *,
                         shard_size: int = 1) -> Assignment:
    """Like assign(), but rank 0 always goes to a worker that holds the committed state.

    `holders` are the slots, in rank order, of the live workers that hold it (the current
    round's surviving members). Hosts with holders go first, in their order, so a host
    whose workers all died and were started afresh (back from the blacklist) can never
    take rank 0 and broadcast a fresh model over the committed one. When no holder's host
    is wanted any more (every host replaced at once), the first holder stays for one more
    round as rank 0 and hands the state over; the round after that lets it go.
    `keepers` (default: `holders`) narrows who can do that: the workers known to hold the
    committed state, which may include one leaving the job. With `shard_size` S, the
    keeper's host gives its slots up to the keeper's, rounded up to a whole replica group
    (`hosts` and `max_size` already come in multiples of S).
    """
    keepers = holders if keepers is None else keepers
    holder_hosts = list(dict.fromkeys(slot.host for slot in [*keepers, *holders]))
    ordered = sorted(hosts, key=lambda entry: (holder_hosts.index(entry[0])
                                               if entry[0] in holder_hosts else len(holder_hosts)))
    # Within a host too: a slot given a new worker (the one before it died) must not take a
    # lower rank than a holder of the state on the same host; holders keep their order.
    keeping = set(keepers)
    first = {slot: (0 if slot in keeping else 1, position)
             for position, slot in enumerate(holders)}
    first.update({slot: (0, len(holders)) for slot in keeping if slot not in first})
    ordered = [(host, _holders_first(host, slot_indices(slots), first, shard_size))
               for host, slots in ordered]
    assignment = assign(ordered, max_size)
    if not keepers or any(slot in assignment for slot in keepers):
        return assignment
    keeper = keepers[0]
    rest = [(host, slots) for host, slots in ordered if host != keeper.host]
    kept = -(-(keeper.index + 1) // shard_size) * shard_size
    return assign([(keeper.host, range(kept)), *rest], max_size)


def _holders_first(host: str, indices: Sequence[int], first: dict[SlotId, tuple[int, int]],
                   shard_size: int) -> list[int]:
    """A host's slot indices, replica group by replica group (slots g*S .. g*S+S-1): the
    groups holding the state first, in their holders' order (`first`: slot -> (0 for a
    keeper, 1 for another holder; its place among the holders)), then the others in index
    order. A group keeps its slots in order, so a rank's shard index (rank % S) stays its
    local rank's."""
    groups: dict[int, list[int]] = {}
    for index in indices:
        groups.setdefault(index // shard_size, []).append(index)
    others = (2, 0)
    ranked = sorted(groups.values(), key=lambda group: min(
        first.get(SlotId(host, index), others) for index in group))
    return [index for group in ranked for index in group]
