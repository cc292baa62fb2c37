"""Builds each kind of group a fixed-size elasticrun.torch job builds on Gloo, and uses it:
the round's default group (init; again after shutdown), a process set that rank 0 is not
in (torch's new_group gives a non-member its sentinel), and DistributedOptimizer's
reductions. Prints "groups ok RANK" at the end; nothing else is printed."""

from __future__ import annotations

import torch

import elasticrun.torch as er

for cycle in range(2):
    er.init()
    model = torch.nn.Linear(3, 1)
    er.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = er.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                        named_parameters=model.named_parameters())
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(4, 3)).pow(2).mean().backward()
        optimizer.step()
    alone = er.add_process_set([1])
    if er.rank() == 1:
        assert er.allreduce(torch.ones(1), op=er.Sum, process_set=alone).item() == 1.0
    assert er.remove_process_set(alone)
    assert er.allreduce(torch.ones(1), op=er.Sum).item() == er.size()
    er.barrier()
    if cycle == 0:
        er.shutdown()
print(f"groups ok {er.rank()}", flush=True)
