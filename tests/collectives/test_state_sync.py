"""TorchState.sync() on real Gloo ranks: the model and optimizer are sent from rank 0 unless
every rank holds the same commit, and after any sync every rank holds rank 0's state."""

from __future__ import annotations

import torch
from torch import nn

import elasticrun.torch as er
from elasticrun.torch import functions
from tests.collectives.conftest import world_of


def _counting_broadcasts() -> list[int]:
    """Counts this rank's broadcast_parameters calls (the real ones still run)."""
    calls = [0]
    real = functions.broadcast_parameters

    def counted(*args: object, **kwargs: object) -> None:
        calls[0] += 1
        real(*args, **kwargs)  # type: ignore[arg-type]

    functions.broadcast_parameters = counted  # type: ignore[assignment]
    return calls


def _syncs(ahead_rank: int) -> tuple[list[int], list[float]]:
    """First sync, a commit on every rank, a rollback and sync (same commit everywhere), then
    `ahead_rank` alone saves a changed model (its commit completed, the others' did not) and
    everyone rolls back and syncs. Returns the broadcasts counted after each sync, and the
    final parameters."""
    torch.manual_seed(er.rank())  # every rank starts from different parameters
    model = nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = er.elastic.TorchState(model, optimizer, step=0)
    real = functions.broadcast_parameters
    calls = _counting_broadcasts()
    try:
        counts = []
        state.sync()  # never synced: sent
        counts.append(calls[0])
        state.step = 1
        state.save()
        with torch.no_grad():
            model.weight.add_(1.0)  # work after the commit, lost by the rollback
        state.restore()
        state.sync()  # the same commit on every rank: nothing sent
        counts.append(calls[0])
        if er.rank() == ahead_rank:
            with torch.no_grad():
                model.weight.mul_(3.0)
            state.save()
        state.restore()
        state.sync()  # one rank holds another commit: sent
        counts.append(calls[0])
    finally:
        functions.broadcast_parameters = real  # type: ignore[assignment]
    return counts, [float(v) for v in torch.cat([p.detach().flatten()
                                                 for p in model.parameters()])]


def test_sync_sends_the_model_only_when_the_ranks_commits_differ() -> None:
    results = world_of(3).run(_syncs, 2)
    assert [counts for counts, _ in results] == [[1, 1, 2]] * 3
    rank0 = results[0][1]
    assert all(params == rank0 for _, params in results)  # bitwise: rank 0's everywhere


def test_a_rank_whose_commit_is_ahead_gets_rank_0s_state() -> None:
    results = world_of(2).run(_syncs, 0)  # rank 0 is the one ahead: its state wins
    assert [counts for counts, _ in results] == [[1, 1, 2]] * 2
    assert results[0][1] == results[1][1]


def _after_a_cut_reduction(unsettled: bool) -> tuple[int, list[float]]:
    """Every rank holds the same commit count, but rank 1's tensors differ, as a reduction
    cut midway by an NCCL abort leaves them; `unsettled`: such an abort happened (the flag
    the session sets when it aborts an NCCL group with work maybe in flight)."""
    from elasticrun.torch.world import groups

    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = er.elastic.TorchState(model, optimizer)
    state.sync()  # equal everywhere, and synced
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()  # momentum buffers: optimizer state to compare too
    if er.rank() == 1:
        with torch.no_grad():
            model.bias[0] += 0.5  # as far as this rank's reduction got
    state.save()  # the commit every rank completed (equal counts)
    real = functions.broadcast_parameters
    calls = _counting_broadcasts()
    try:
        groups._unsettled = unsettled
        state.sync()
    finally:
        functions.broadcast_parameters = real  # type: ignore[assignment]
        groups._unsettled = False
    return calls[0], [float(v) for v in torch.cat([p.detach().flatten()
                                                   for p in model.parameters()])]


def test_after_an_nccl_abort_ranks_compare_what_they_hold() -> None:
    results = world_of(2).run(_after_a_cut_reduction, True)
    assert [calls for calls, _ in results] == [1, 1]
    assert results[0][1] == results[1][1]  # rank 0's state everywhere


def test_without_an_abort_equal_commits_are_trusted() -> None:
    results = world_of(2).run(_after_a_cut_reduction, False)
    assert [calls for calls, _ in results] == [0, 0]  # the counts alone decide: not sent
    assert results[0][1] != results[1][1]
