"""`join()`: a rank that ran out of data keeps serving the others' allreduces until all join.

A joined rank takes part in every negotiation (negotiation.py) with neutral fields and its
join flags; when the training ranks negotiated an allreduce, it contributes zeros of each
bucket, as Horovod's joined ranks do (so an Average is still divided by the full size, and
a Min or Max sees the zeros too). A barrier completes with it. Any other collective fails on
the training ranks with Horovod's "not supported with Join" error while a rank has joined,
and the joined rank goes on waiting. `join()` returns the rank that joined last, the same on
every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from elasticrun.torch.collectives import host_vote
from elasticrun.torch.collectives.negotiation import Agreement, negotiate_joined
from elasticrun.torch.collectives.requests import WIRE_OPS, Kind
from elasticrun.torch.world import plane, runtime
from elasticrun.torch.world.boundary import collective


def join(device: int = -1) -> int:
    """Blocks until every rank has called join(), serving the others' allreduces with zeros
    meanwhile. Returns the rank that joined last (the highest of those that joined at the
    same moment). `device` is accepted for Horovod's signature."""
    slot = runtime.current().slot
    # The ranks' steps differ from here until all have joined: none may then use a vote
    # that its last step carried (a joined rank serves the vote element with a zero).
    host_vote.discard()
    if slot.size == 1:
        return 0
    joining = True
    while True:
        agreed = negotiate_joined(joining)
        joining = False
        if agreed.all_joined:
            host_vote.discard()
            return agreed.last_joiner
        if agreed.failed or agreed.early or agreed.kind != Kind.ALLREDUCE:
            continue  # they raised, a barrier completed, or the data is announced again
        serve(agreed)


def serve(agreed: Agreement) -> None:
    """Contributes zeros to each bucket of the allreduce the training ranks run, with
    their reduce op (Gloo combines with each rank's own)."""
    device = plane.cuda_device() if agreed.device == "GPU" else torch.device("cpu")
    op = WIRE_OPS.get(agreed.op, dist.ReduceOp.SUM)
    for numel, dtype in agreed.buckets:
        zeros = torch.zeros(numel, dtype=dtype, device=device)
        with collective("join: serving an allreduce"):
            plane.all_reduce(zeros, op=op)
