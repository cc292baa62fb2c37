"""Pure: --shard-size S, rounds made of replica groups of S consecutive ranks.

A replica group never spans hosts: each host gives a multiple of S of its slots, and the
round's size (at most --max-np) is a multiple of S. Ranks are filled host by host
(assignment.py), so a worker's shard index (rank % S) is its local rank % S for as long as it
lives, and a host's failure takes whole groups out of the job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from elasticrun.driver.rounds.step import Step


def whole_groups(slots_per_host: Mapping[str, Sequence[int]], shard_size: int
                 ) -> dict[str, tuple[int, ...]]:
    """Each host's usable slot indices that make whole replica groups (group g is slots
    g*S .. g*S+S-1, all usable); hosts left with none are dropped. With `shard_size` 1,
    the slots as given."""
    whole = {}
    for host, slots in slots_per_host.items():
        present = set(slots)
        kept = tuple(i for i in slots if all(
            g in present for g in range(i - i % shard_size, i - i % shard_size + shard_size)))
        if kept:
            whole[host] = kept
    return whole


def whole_size(max_np: int | None, shard_size: int) -> int | None:
    """--max-np rounded down to a multiple of `shard_size` (None: no limit)."""
    return None if max_np is None else max_np - max_np % shard_size


def left_over(slots_per_host: Mapping[str, int], shard_size: int) -> dict[str, int]:
    """host -> its slots that cannot fill a replica group (hosts with none are left out)."""
    return {host: rest for host, slots in slots_per_host.items()
            if slots > 0 and (rest := slots % shard_size) > 0}


def note_left_over(step: Step) -> None:
    """Logs the usable hosts' slots that no replica group can use, once per change."""
    state, shard_size = step.state, step.config.shard_size
    if shard_size == 1:
        return
    current = left_over(state.hosts.usable(step.now), shard_size)
    for host, unused in current.items():
        if state.left_over.get(host) != unused:
            step.log("info", f"host {host}: {unused} slot(s) unused: they cannot fill a "
                             f"replica group of --shard-size {shard_size}")
    state.left_over = current
