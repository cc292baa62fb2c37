"""barrier(): returns once every rank has called it. The negotiation that precedes every
collective is the barrier: nothing follows it (a rank that called join() serves it too)."""

from __future__ import annotations

from elasticrun.torch.collectives.negotiation import negotiate
from elasticrun.torch.collectives.process_sets import ProcessSet, global_process_set, scope
from elasticrun.torch.collectives.requests import Kind, Request


def barrier(process_set: ProcessSet | None = global_process_set) -> None:
    """Returns once every rank has called barrier()."""
    negotiate(Request(Kind.BARRIER), scope=scope(process_set, "barrier"))
