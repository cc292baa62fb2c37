"""barrier(): returns once every rank has called it.
"""

from __future__ import annotations

from elasticrun.torch.collectives import join
from elasticrun.torch.collectives.process_sets import ProcessSet, check, global_process_set
from elasticrun.torch.world.place import world


def barrier(process_set: ProcessSet | None = global_process_set) -> None:
    """Returns once every rank has called barrier() (the header collective is the barrier)."""
    check(process_set, "barrier")
    if world()[1] > 1:
        join.announced(join.BARRIER)
