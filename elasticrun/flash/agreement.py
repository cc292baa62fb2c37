"""Which flash commit a restarted job resumes from, agreed by all its ranks.

Every rank says which steps its host holds whole and which step the script's own
checkpoint is at; all decide alike (`choose`, pure): the newest step that every rank can
have, if it is newer than every rank's own checkpoint. Where state is replicated (DDP),
a step one host holds is enough: a rank whose host lacks it (a node replaced by a new
one) receives the shared part from the lowest rank that has it. Where each rank holds its
own state (shards), every rank needs its own part of the step. Then each rank loads its
parts, and all check that every rank could (`confirm`): if one could not, none uses the
flash commit and the script's own checkpoint decides, for all alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist


@dataclass(frozen=True)
class Holdings:
    """What one rank can resume from."""

    shared: tuple[int, ...]  # steps whose shared part its host holds whole
    own: tuple[int, ...]  # steps whose part of its own its host holds whole
    script_step: int  # the step of the script's own checkpoint (0: none)


@dataclass(frozen=True)
class Plan:
    step: int
    sources: dict[int, int]  # rank -> the rank that sends it the shared part


def choose(holdings: list[Holdings], replicated: bool) -> Plan | None:
    """The flash commit all ranks resume from (None: the script's own checkpoint)."""
    newest_own = max((h.script_step for h in holdings), default=0)
    if replicated:
        steps = set().union(*(h.shared for h in holdings))
    else:
        steps = set.intersection(*(set(h.own) for h in holdings)) if holdings else set()
    candidates = [step for step in steps if step > newest_own]
    if not candidates:
        return None
    step = max(candidates)
    sources: dict[int, int] = {}
    if replicated:
        holders = [rank for rank, h in enumerate(holdings) if step in h.shared]
        sources = {rank: holders[0] for rank, h in enumerate(holdings) if step not in h.shared}
    return Plan(step, sources)


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def gather(mine: Holdings) -> list[Holdings]:
    if not distributed():
        return [mine]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


def pass_shared(plan: Plan, rank: int, shared: Any) -> Any:
    """Sends the shared part to the ranks the plan names, from their sources; returns this
    rank's (received, or its own `shared`)."""
    for needy, source in sorted(plan.sources.items()):
        if rank == source:
            dist.send_object_list([shared], dst=needy)
        elif rank == needy:
            received: list[Any] = [None]
            dist.recv_object_list(received, src=source)
            shared = received[0]
    return shared


def confirm(ready: bool) -> bool:
    """Whether every rank could load its parts of the plan's step."""
    if not distributed():
        return ready
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, ready)
    return all(everyone)
