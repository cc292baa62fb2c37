"""Horovod's init -> shutdown -> init, as its unit tests do it: five cycles of init, an
allreduce, barrier, shutdown, then a sixth init and a collective. Prints one line per cycle
(the round it ran in) and "reinit ok"."""

from __future__ import annotations

import torch

import elasticrun.torch as hvd
from elasticrun.torch.world import runtime

for cycle in range(6):
    assert not hvd.is_initialized()
    hvd.init()
    assert hvd.is_initialized()
    total = hvd.allreduce(torch.ones(3) * (hvd.rank() + 1), op=hvd.Sum, name="cycle")
    assert total.tolist() == [sum(range(1, hvd.size() + 1))] * 3, total
    gathered = hvd.allgather(torch.tensor([hvd.rank()]))
    assert gathered.tolist() == list(range(hvd.size())), gathered
    print(f"cycle {cycle}: rank {hvd.rank()} of {hvd.size()} in round "
          f"{runtime.current().round}", flush=True)
    if cycle < 5:
        hvd.barrier()
        hvd.shutdown()
        assert not hvd.is_initialized()
print("reinit ok", flush=True)
