"""DistributedOptimizer as Horovod's test_torch.py sees it, on real Gloo ranks: its
`_parameter_names` (Horovod's "allreduce.noname.{i}.{j}" without named_parameters, the same
on every rank); built on a rank outside its process set, where it steps locally while the
members average; and sparse gradients (nn.Embedding(sparse=True), a different number of
indices per rank) that come back sparse after synchronize() with sparse_as_dense too, so
that SparseAdam steps."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

import elasticrun.torch as hvd
from elasticrun.torch.compression import Compression, Compressor, NoneCompressor
from tests.collectives.conftest import world_of


class _General(NoneCompressor):
    """Neither Compression.none nor fp16: the general path (a collective per bucket)."""


COMPRESSIONS: dict[str, type[Compressor]] = {
    "none": Compression.none, "fp16": Compression.fp16, "general": _General}


def _grad(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None
    return p.grad


def _parameter_names() -> dict[str, Any]:
    torch.manual_seed(0)
    first, second = nn.Linear(10, 10), nn.Linear(10, 10)
    model = nn.Sequential(first, second)
    groups = [{"params": first.parameters()}, {"params": second.parameters()}]
    optimizer: Any = hvd.DistributedOptimizer(torch.optim.SGD(groups, lr=0.001))
    names = optimizer._parameter_names
    expected = {p: f"allreduce.noname.{i}.{j}" for i, group in enumerate(optimizer.param_groups)
                for j, p in enumerate(group["params"])}
    named: Any = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.001),
                                          named_parameters=model.named_parameters())
    # the names do not change the reduction: one step's gradients are averaged
    model(torch.full((1, 10), float(hvd.rank()))).sum().backward()
    named.step()
    return {"same": names == expected, "unique": len(set(names.values())) == len(names),
            "everyone": hvd.allgather_object(sorted(names.values())),
            "named": named._parameter_names == dict(
                (p, n) for n, p in model.named_parameters()),
            "bias_grad": _grad(first.bias).tolist()}


def test_parameters_are_named_as_horovod_names_them() -> None:
    results = world_of(2).run(_parameter_names)
    expected = [f"allreduce.noname.{i}.{j}" for i in range(2) for j in range(2)]
    for result in results:
        assert result["same"] and result["unique"] and result["named"], result
        assert result["everyone"] == [expected, expected]
    assert results[0]["bias_grad"] == results[1]["bias_grad"]


def _outside_the_set() -> dict[str, Any]:
    """Ranks {0, 2} in the optimizer's set, rank 1 outside it (in a set of its own)."""
    rank = hvd.rank()
    even, odd = hvd.add_process_set([0, 2]), hvd.add_process_set([1])
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    local = nn.Linear(4, 2)
    local.load_state_dict(model.state_dict())
    optimizer: Any = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                              named_parameters=model.named_parameters(),
                                              process_set=even)
    reference = torch.optim.SGD(local.parameters(), lr=0.5)
    x = torch.full((1, 4), float(rank + 1))
    result: dict[str, Any] = {}
    passes = 2 if rank == 1 else 1  # outside: no hooks, so no backward_passes_per_step guard
    for _ in range(passes):
        model(x).sum().backward()
        local(x).sum().backward()
    optimizer.synchronize()
    result["grad"] = _grad(model.weight).tolist()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        optimizer.step()  # without skip_synchronize(): Horovod warns, inside or outside
    result["warned"] = [str(w.message) for w in caught]
    reference.step()
    result["local_step"] = torch.equal(model.weight, local.weight)
    result["weight"] = model.weight.detach().tolist()
    mine = even if rank in (0, 2) else odd
    result["in_set"] = hvd.allgather(model.weight.detach()[None], process_set=mine).tolist()
    result["removed"] = (hvd.remove_process_set(odd), hvd.remove_process_set(even))
    result["in_step"] = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
    return result


def test_an_optimizer_outside_its_process_set_steps_locally() -> None:
    results = world_of(3).run(_outside_the_set)
    # gradients of sum(W x) are rows of x: rank r's x is r + 1, so ranks 0 and 2 average 2
    assert results[0]["grad"] == results[2]["grad"] == [[2.0] * 4] * 2
    assert results[1]["grad"] == [[4.0] * 4] * 2  # two local passes of rank 1's 2
    assert results[1]["local_step"] and not results[0]["local_step"]
    assert results[0]["weight"] == results[2]["weight"] != results[1]["weight"]
    assert results[0]["in_set"] == results[2]["in_set"] == [results[0]["weight"]] * 2
    assert results[1]["in_set"] == [results[1]["weight"]]
    for result in results:
        assert len(result["warned"]) == 1, result["warned"]
        assert "called without optimizer.skip_synchronize()" in result["warned"][0]
        assert result["removed"] == (True, True) and result["in_step"] == 3.0


INPUTS = {0: [[1, 2, 4, 5], [4, 3, 2, 9]], 1: [[1, 3, 4], [4, 7, 9]]}  # Horovod's test


def _expected_average() -> list[list[float]]:
    """d sum(embedding(x)) / d weight: each row the count of its index, averaged."""
    counts = torch.stack([torch.bincount(torch.tensor(v).flatten(), minlength=10)
                          for v in INPUTS.values()]).sum(0)
    return (counts[:, None].float().expand(10, 3) / len(INPUTS)).tolist()


def _sparse_embeddings(compression: str, groups: int) -> list[dict[str, Any]]:
    results = []
    for sparse_as_dense in (False, True):
        torch.manual_seed(0)
        # two embeddings: with groups=2, two buckets, the first started from its hooks
        model = [nn.Embedding(10, 3, sparse=True) for _ in range(2)]
        inputs = torch.tensor(INPUTS[hvd.rank()])
        sparse_adam = torch.optim.SparseAdam([e.weight for e in model], lr=0.1)
        optimizer: Any = hvd.DistributedOptimizer(sparse_adam, sparse_as_dense=sparse_as_dense,
                                                  compression=COMPRESSIONS[compression],
                                                  num_groups=groups)
        for _ in range(2):
            optimizer.zero_grad()
            torch.stack([e(inputs).sum() for e in model]).sum().backward()
            optimizer.synchronize()
            grads = [_grad(e.weight) for e in model]
            with optimizer.skip_synchronize():
                optimizer.step()  # SparseAdam: sparse gradients only
        results.append({"sparse_as_dense": sparse_as_dense,
                        "is_sparse": [g.is_sparse for g in grads],
                        "sparse_dim": [g.sparse_dim() for g in grads if g.is_sparse],
                        "grads": [g.to_dense().tolist() for g in grads],
                        "weights": [e.weight.detach().tolist() for e in model]})
    return results


@pytest.mark.parametrize(("compression", "groups"),
                         [("none", 0), ("none", 2), ("fp16", 0), ("general", 0)])
def test_sparse_gradients_come_back_sparse_with_sparse_as_dense(compression: str,
                                                                groups: int) -> None:
    expected = _expected_average()
    per_rank = world_of(2).run(_sparse_embeddings, compression, groups)
    for rank_results in per_rank:
        for result in rank_results:
            assert result["is_sparse"] == [True, True], result
            assert result["sparse_dim"] == [1, 1], result
            assert result["grads"] == [expected, expected], result
    for mine, theirs in zip(*per_rank, strict=True):
        assert mine["weights"] == theirs["weights"]  # every rank stepped alike
