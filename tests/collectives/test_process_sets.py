"""Horovod's process sets on real Gloo ranks, in a job that is not elastic: static and
dynamic sets, every collective among a set's members (ranks and a broadcast's root are
global ranks; rank() is the place in the set), and the refusals Horovod makes. In an
elastic job every set but the global one is refused."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

import elasticrun.torch as hvd
from elasticrun import protocol
from elasticrun.job.errors import NotSupportedError
from elasticrun.torch.collectives.process_sets import init_process_sets
from tests.collectives.conftest import world_of


def _collectives_within(mine: hvd.ProcessSet) -> dict[str, Any]:
    rank, ranks = hvd.rank(), mine.ranks
    assert ranks is not None
    result: dict[str, Any] = {"place": mine.rank(), "size": mine.size()}
    result["sum"] = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum,
                                  process_set=mine).item()
    result["average"] = hvd.allreduce(torch.tensor([float(rank)]), process_set=mine).item()
    result["gathered"] = hvd.allgather(torch.tensor([rank]), process_set=mine).tolist()
    result["from_root"] = hvd.broadcast(torch.tensor([rank]), root_rank=ranks[-1],
                                        process_set=mine).item()
    result["alltoall"] = hvd.alltoall(torch.tensor([rank * 10, rank * 10 + 1]),
                                      process_set=mine).tolist()
    result["share"] = hvd.reducescatter(torch.tensor([1.0, 2.0]), op=hvd.Sum,
                                        process_set=mine).tolist()
    result["objects"] = hvd.allgather_object(f"r{rank}", process_set=mine)
    hvd.barrier(process_set=mine)
    # a DistributedOptimizer whose gradients are averaged within the set only
    torch.manual_seed(0)
    model = nn.Linear(2, 1, bias=False)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                         process_set=mine)
    model(torch.tensor([[float(rank), 1.0]])).sum().backward()
    optimizer.synchronize()
    result["grad"] = model.weight.grad.tolist()
    with optimizer.skip_synchronize():
        optimizer.step()
    return result


def _every_collective_in_sets() -> dict[str, Any]:
    """Sets {0, 2} and {0, 1}: rank 0 is in both, so it serves {0, 2} first, then {0, 1}."""
    rank = hvd.rank()
    odd, low = hvd.ProcessSet([2, 0]), hvd.ProcessSet([0, 1])  # permuted: the same set
    init_process_sets([odd, low])
    result: dict[str, Any] = {"ids": (odd.process_set_id, low.process_set_id),
                              "included": (odd.included(), low.included())}
    for key, mine in (("odd", odd), ("low", low)):
        if mine.included():
            result[key] = _collectives_within(mine)
    if rank != 0:  # an outsider's call raises at once, before any data moves
        try:
            hvd.allreduce(torch.ones(1), process_set=low if rank == 2 else odd)
            result["outsider"] = "nothing"
        except ValueError as exc:
            result["outsider"] = str(exc)
    result["removed"] = (hvd.remove_process_set(odd), hvd.remove_process_set(low))
    return result


def test_every_collective_runs_among_the_members_of_a_set() -> None:
    results = world_of(3).run(_every_collective_in_sets)
    assert [r["ids"] for r in results] == [(1, 2)] * 3
    assert [r["included"] for r in results] == [(True, True), (False, True), (True, False)]
    odd = [results[0]["odd"], results[2]["odd"]]  # ranks 0 and 2
    low = [results[0]["low"], results[1]["low"]]  # ranks 0 and 1
    assert "low" not in results[2] and "odd" not in results[1]
    assert [r["place"] for r in odd] == [0, 1] and [r["place"] for r in low] == [0, 1]
    assert [r["size"] for r in odd + low] == [2] * 4
    assert [r["sum"] for r in odd] == [2.0, 2.0] and [r["sum"] for r in low] == [1.0, 1.0]
    assert [r["average"] for r in odd] == [1.0, 1.0]
    assert [r["average"] for r in low] == [0.5, 0.5]
    assert [r["gathered"] for r in odd] == [[0, 2]] * 2
    assert [r["gathered"] for r in low] == [[0, 1]] * 2
    # the root is a global rank
    assert [r["from_root"] for r in odd] == [2, 2] and [r["from_root"] for r in low] == [1, 1]
    assert [r["alltoall"] for r in odd] == [[0, 20], [1, 21]]
    assert [r["alltoall"] for r in low] == [[0, 10], [1, 11]]
    assert [r["share"] for r in odd] == [[2.0], [4.0]]
    assert [r["objects"] for r in low] == [["r0", "r1"]] * 2
    assert [r["removed"] for r in results] == [(True, True)] * 3
    assert "rank 2 is not in it" in results[2]["outsider"]
    assert "rank 1 is not in it" in results[1]["outsider"]
    # each rank's gradient [rank, 1], averaged over its set's members
    assert [r["grad"] for r in odd] == [[[1.0, 1.0]]] * 2
    assert [r["grad"] for r in low] == [[[0.5, 1.0]]] * 2


def _dynamic() -> dict[str, Any]:
    added = hvd.add_process_set([1, 0])
    result: dict[str, Any] = {"id": added.process_set_id}
    try:
        hvd.add_process_set(hvd.ProcessSet([0, 1]))
        result["duplicate"] = "nothing"
    except ValueError as exc:
        result["duplicate"] = str(exc)
    if hvd.rank() in (0, 1):
        result["sum"] = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=added).item()
    result["removed"] = hvd.remove_process_set(added)
    result["again"] = hvd.remove_process_set(added)
    result["global"] = hvd.remove_process_set(hvd.global_process_set)
    try:
        hvd.allreduce(torch.ones(1), process_set=added)
        result["after"] = "nothing"
    except ValueError as exc:
        result["after"] = str(exc)
    try:
        init_process_sets([hvd.ProcessSet([0]), hvd.ProcessSet([0])])
        result["twice"] = "nothing"
    except ValueError as exc:
        result["twice"] = str(exc)
    return result


def test_sets_are_added_and_removed_by_every_rank_together() -> None:
    results = world_of(3).run(_dynamic)
    for rank, result in enumerate(results):
        assert result["id"] >= 1
        assert "Attempted to add a duplicate process set" in result["duplicate"], result
        assert result.get("sum", 2.0) == 2.0
        assert (result["removed"], result["again"], result["global"]) == (True, False, False)
        assert "is not initialised" in result["after"]
        assert "a process set is given twice" in result["twice"], (rank, result)


def _elastic_refuses() -> list[str]:
    os.environ[protocol.ENV_ELASTIC] = "1"
    refused = []
    try:
        for attempt in (lambda: hvd.add_process_set([0]),
                        lambda: init_process_sets([hvd.ProcessSet([0])])):
            try:
                attempt()
            except NotSupportedError as exc:
                refused.append(str(exc))
    finally:
        os.environ[protocol.ENV_ELASTIC] = "0"
    return refused


def test_an_elastic_job_refuses_every_set_but_the_global_one() -> None:
    for refused in world_of(2).run(_elastic_refuses):
        assert len(refused) == 2 and all("ranks change at every reset" in r for r in refused)
