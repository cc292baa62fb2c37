"""`join()`: a rank that ran out of data keeps serving the others' allreduces until all join.

Horovod learns which ranks joined through its coordinator, which negotiates every tensor.
elasticrun has no coordinator, so every collective it issues is preceded by a tiny header
collective that says what follows (kind, element count, dtype, reduce op) and which ranks
have joined. Ranks still training launch the header and the data together, without waiting;
a joined rank waits for each header and then launches the matching data collective with the
reduce op's identity (zeros for a sum), so the others' results are those of the ranks that
still have data, divided by the full size for Average, as with Horovod. As with Horovod,
only allreduces (and elasticrun's own agreement votes) can run while a rank is joined; any
other collective then fails on the ranks that issued it with a ValueError naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from elasticrun.torch.collectives import host_vote
from elasticrun.torch.world import plane, runtime
from elasticrun.torch.world.boundary import collective

# The kinds of collective a header announces. A joined rank serves ALLREDUCE only.
ALLREDUCE, BROADCAST, ALLGATHER, ALLTOALL, REDUCESCATTER, BARRIER, ADASUM, OBJECT = range(1, 9)
KIND_NAMES = {ALLREDUCE: "allreduce", BROADCAST: "broadcast", ALLGATHER: "allgather",
              ALLTOALL: "alltoall", REDUCESCATTER: "reducescatter", BARRIER: "barrier",
              ADASUM: "Adasum allreduce", OBJECT: "object collective"}

RedOp = dist.ReduceOp.RedOpType
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
           torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]
_OPS = [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT]
# header = [kind, numel, dtype, op, last joiner, on a GPU, joined flag of rank 0, of rank 1,
# ...]; every field is reduced with MAX: ranks still training fill the first four and the
# device, joined ranks contribute zeros there and 1 at their own place.
_FIELDS = 6


@dataclass(frozen=True)
class Announced:
    """What a header said: the collective that follows, and who has joined."""

    kind: int
    numel: int
    dtype: torch.dtype
    op: RedOp
    last_joiner: int
    joined: int  # how many ranks have joined
    cuda: bool = False  # the data is on the ranks' GPUs

    def check_served(self) -> None:
        """On a rank still training: the collective it announced can run."""
        if self.joined and self.kind != ALLREDUCE:
            raise ValueError(f"{KIND_NAMES.get(self.kind, 'this collective')} cannot run while "
                             f"{self.joined} rank(s) have called join(): only allreduce can "
                             "(as with Horovod)")


def _header(kind: int, numel: int, dtype: torch.dtype, op: RedOp, cuda: bool) -> torch.Tensor:
    size = runtime.current().slot.size
    header = torch.zeros(_FIELDS + size, dtype=torch.int64)
    header[0], header[1] = kind, numel
    header[2] = _DTYPES.index(dtype) + 1 if dtype in _DTYPES else 0
    header[3] = _OPS.index(op) + 1 if op in _OPS else 0
    header[4] = -1
    header[5] = int(cuda)
    return header


def _read(header: torch.Tensor) -> Announced:
    dtype_code, op_code = int(header[2]), int(header[3])
    return Announced(kind=int(header[0]), numel=int(header[1]),
                     dtype=_DTYPES[dtype_code - 1] if dtype_code else torch.float32,
                     op=_OPS[op_code - 1] if op_code else dist.ReduceOp.SUM,
                     last_joiner=int(header[4]), joined=int(header[_FIELDS:].sum()),
                     cuda=bool(header[5]))


class Header:
    """A header in flight: `wait()` returns what it announced; it also sits among a
    handle's works (`is_completed`, `wait`)."""

    def __init__(self, tensor: torch.Tensor, work: plane.Work | None) -> None:
        self._tensor = tensor
        self._work = work

    def is_completed(self) -> bool:
        return self._work is None or self._work.is_completed()

    def wait(self) -> Announced:
        if self._work is not None:
            with collective("the collective header"):
                self._work.wait()
            self._work = None
        return _read(self._tensor)


def announce(kind: int, numel: int = 0, dtype: torch.dtype = torch.float32,
             op: RedOp = dist.ReduceOp.SUM, cuda: bool = False) -> Header:
    """Launches the header of a collective this rank is about to launch (`cuda`: on its
    GPU). With a world of one, nothing is sent."""
    header = _header(kind, numel, dtype, op, cuda)
    if runtime.current().slot.size == 1:
        return Header(header, None)
    with collective("the collective header"):
        work = plane.all_reduce(header, op=dist.ReduceOp.MAX, async_op=True)
    return Header(header, work)


def announced(kind: int, numel: int = 0, dtype: torch.dtype = torch.float32,
              op: RedOp = dist.ReduceOp.SUM) -> Announced:
    """Sends a header and waits for it: for collectives a joined rank cannot serve, which
    must not start when a rank has joined."""
    result = announce(kind, numel, dtype, op).wait()
    result.check_served()
    return result


def identity(op: RedOp, numel: int, dtype: torch.dtype,
             device: torch.device | str = "cpu") -> torch.Tensor:
    """What a joined rank contributes: the op's identity, so it changes nothing."""
    if op == dist.ReduceOp.PRODUCT:
        return torch.ones(numel, dtype=dtype, device=device)
    if op in (dist.ReduceOp.MIN, dist.ReduceOp.MAX):
        if dtype == torch.bool:
            return torch.full((numel,), op == dist.ReduceOp.MIN, dtype=dtype, device=device)
        info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
        fill = info.max if op == dist.ReduceOp.MIN else info.min
        return torch.full((numel,), fill, dtype=dtype, device=device)
    return torch.zeros(numel, dtype=dtype, device=device)


def join(device: int = -1) -> int:
    """Blocks until every rank has called join(), serving the others' allreduces with the
    reduce op's identity meanwhile. Returns the rank that joined last (the highest of those
    that joined at the same moment). `device` is accepted for Horovod's signature."""
    slot = runtime.current().slot
    # The ranks' steps differ from here until all have joined: none may then use a vote
    # that its last step carried (a joined rank serves the vote element with a zero).
    host_vote.discard()
    if slot.size == 1:
        return 0
    first = True
    while True:
        header = torch.zeros(_FIELDS + slot.size, dtype=torch.int64)
        header[4] = slot.rank if first else -1
        header[_FIELDS + slot.rank] = 1
        first = False
        with collective("join"):
            plane.all_reduce(header, op=dist.ReduceOp.MAX)
        said = _read(header)
        if said.joined == slot.size:
            host_vote.discard()
            return said.last_joiner
        if said.kind != ALLREDUCE:
            continue  # the ranks that issued it raise; nothing follows the header
        contribution = identity(said.op, said.numel, said.dtype,
                                plane.cuda_device() if said.cuda else "cpu")
        with collective("join: serving an allreduce"):
            plane.all_reduce(contribution, op=said.op)
