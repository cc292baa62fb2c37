"""The host-change vote carried by the gradient reduction, on real Gloo ranks: a notice on
one rank makes every rank interrupt at the same commit without a collective of its own; a
commit with nothing fresh to read (no step since the last agreement, another optimizer,
Adasum, a new round, after join()) falls back to the separate agreement; no vote is lost."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import nn

import elasticrun.torch as er
from elasticrun.torch import elastic
from elasticrun.torch.world import runtime
from tests.collectives.conftest import world_of


class Probe:
    """This rank's view of host-change notices (set by the test) and a count of the
    separate agreement collectives started."""

    def __init__(self) -> None:
        self.notice = False
        self.agreements = 0


@contextmanager
def probed() -> Iterator[Probe]:
    probe = Probe()
    live = runtime.current()
    backend = elastic._backend
    start = backend.start_agreement

    def counted(flag: bool) -> Callable[[], bool]:
        probe.agreements += 1
        return start(flag)

    live.hosts_changed = lambda: probe.notice  # type: ignore[method-assign]
    backend.start_agreement = counted  # type: ignore[method-assign]
    try:
        yield probe
    finally:
        del live.hosts_changed
        del backend.start_agreement


def _setup(**options: Any) -> tuple[nn.Module, Any, er.elastic.TorchState]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = er.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                        named_parameters=model.named_parameters(), **options)
    return model, optimizer, er.elastic.TorchState(model, optimizer, step=0)


def _backward(model: nn.Module, step: int) -> None:
    generator = torch.Generator().manual_seed(er.rank() * 100 + step)
    x = torch.randn(4, 8, generator=generator)
    y = torch.randint(0, 4, (4,), generator=generator)
    nn.functional.cross_entropy(model(x), y).backward()


def _commit(state: er.elastic.TorchState) -> bool:
    """Whether the commit raised HostsUpdatedInterrupt."""
    try:
        state.commit()
    except er.elastic.HostsUpdatedInterrupt:
        return True
    return False


def interrupts_with_notice_on(noticed: int, steps: int, options: dict[str, Any] | None = None
                              ) -> tuple[list[bool], int]:
    """`steps` steps, each followed by a commit; rank `noticed` sees a notice from the
    third step on (before its backward pass). Whether each commit interrupted, and how many
    separate agreements ran."""
    model, optimizer, state = _setup(**(options or {}))
    interrupted = []
    with probed() as probe:
        for step in range(steps):
            probe.notice = er.rank() == noticed and step >= 2
            optimizer.zero_grad()
            _backward(model, step)
            optimizer.step()
            interrupted.append(_commit(state))
        return interrupted, probe.agreements


@pytest.mark.parametrize("size", [2, 3])
def test_a_notice_on_one_rank_interrupts_every_rank_at_the_same_commit(size: int) -> None:
    results = world_of(size).run(interrupts_with_notice_on, size - 1, 4)
    for interrupted, agreements in results:
        assert interrupted == [False, False, True, True]
        assert agreements == 0  # the vote rode with the gradients


@pytest.mark.parametrize("options", [{"overlap": False}, {"compression": er.Compression.fp16},
                                     {"op": er.Sum}, {"num_groups": 2}])
def test_the_vote_rides_with_every_summing_reduction(options: dict[str, Any]) -> None:
    for interrupted, agreements in world_of(2).run(interrupts_with_notice_on, 0, 3, options):
        assert interrupted == [False, False, True]
        assert agreements == 0


@pytest.mark.parametrize("options", [{"op": er.Adasum}, {"gradient_predivide_factor": 2.0}])
def test_reductions_that_cannot_carry_the_vote_fall_back(options: dict[str, Any]) -> None:
    for interrupted, agreements in world_of(2).run(interrupts_with_notice_on, 1, 3, options):
        assert interrupted == [False, False, True]
        assert agreements == 3


def notice_after_backward(options: dict[str, Any]) -> tuple[list[bool], int]:
    """Rank 1's notice arrives after its backward pass, before its step()."""
    model, optimizer, state = _setup(**options)
    interrupted = []
    with probed() as probe:
        for step in range(3):
            optimizer.zero_grad()
            _backward(model, step)
            if step == 1:
                probe.notice = er.rank() == 1
            optimizer.step()
            interrupted.append(_commit(state))
        return interrupted, probe.agreements


@pytest.mark.parametrize(("options", "expected"), [
    # two buckets: the gradient hooks started the last (the vote's) during backward, so the
    # notice is not in this commit's vote, and the next commit acts on it
    ({"num_groups": 2}, [False, False, True]),
    # one bucket of CPU gradients is started at step(): the notice rides in this step's vote
    ({}, [False, True, True]),
])
def test_a_notice_arriving_mid_step_is_not_lost(options: dict[str, Any],
                                                 expected: list[bool]) -> None:
    for interrupted, agreements in world_of(2).run(notice_after_backward, options):
        assert interrupted == expected
        assert agreements == 0


def commits_without_a_fresh_vote() -> list[tuple[bool, int]]:
    """Each case: (interrupted, separate agreements so far). Rank 0 sees the notice."""
    model, optimizer, state = _setup()
    seen = []
    with probed() as probe:
        optimizer.zero_grad()
        _backward(model, 0)
        optimizer.step()
        seen.append((_commit(state), probe.agreements))  # carried
        probe.notice = er.rank() == 0
        seen.append((_commit(state), probe.agreements))  # no step since: its own collective
        probe.notice = False
        optimizer.zero_grad()
        _backward(model, 1)
        optimizer.step()
        state.check_host_updates()  # its own collective, which the step's vote predates
        probe.notice = er.rank() == 0
        seen.append((_commit(state), probe.agreements))
        probe.notice = False
        optimizer.zero_grad()
        _backward(model, 2)
        optimizer.step()
        session = runtime.current().session
        assert session is not None
        session.number += 1  # a new round: the step's vote belongs to the old one
        try:
            probe.notice = er.rank() == 0
            seen.append((_commit(state), probe.agreements))
        finally:
            session.number -= 1
        return seen


def test_a_commit_without_a_fresh_vote_starts_its_own_agreement() -> None:
    for seen in world_of(2).run(commits_without_a_fresh_vote):
        assert seen == [(False, 0), (True, 1), (True, 3), (True, 4)]


def plain_optimizer_commits() -> tuple[bool, int]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    state = er.elastic.TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with probed() as probe:
        probe.notice = er.rank() == 1
        return _commit(state), probe.agreements


def test_without_a_distributed_optimizer_the_agreement_is_its_own_collective() -> None:
    assert world_of(2).run(plain_optimizer_commits) == [(True, 1), (True, 1)]


def rank_runs_out_of_data() -> tuple[bool, int, bool]:
    """Rank 0 joins at once; rank 1 takes a step (rank 0 serves its bucket, vote included)
    and commits with the carried vote, then joins. After join() every rank's commit starts
    its own agreement: rank 0's last step was long ago, and its notice must not be lost."""
    model, optimizer, state = _setup(overlap=False)
    with probed() as probe:
        probe.notice = er.rank() == 0
        matches = True
        if er.rank() == 0:
            er.join()
        else:
            optimizer.zero_grad()
            _backward(model, 0)
            local = [p.grad.clone() for p in model.parameters() if p.grad is not None]
            optimizer.synchronize()
            # rank 0 contributed zeros; Average divides by the full size, as Horovod does
            matches = all(p.grad is not None and torch.allclose(p.grad, g / er.size())
                          for p, g in zip(model.parameters(), local, strict=True))
            with optimizer.skip_synchronize():
                optimizer.step()
            assert not _commit(state) and probe.agreements == 0
            er.join()
        return _commit(state), probe.agreements, matches


def test_join_serves_the_vote_and_drops_what_a_step_carried() -> None:
    assert world_of(2).run(rank_runs_out_of_data) == [(True, 1, True), (True, 1, True)]


def vote_places(options: dict[str, Any]) -> list[int]:
    """How many elements more than their gradients each bucket of a step carries."""
    _, optimizer, _ = _setup(**options)
    reduction = optimizer._er_reduction
    request = reduction.request()
    return [numel - sum(p.numel() for p in bucket.params)
            for (numel, _), bucket in zip(request.buckets, reduction.buckets, strict=True)]


def test_the_vote_rides_in_the_last_bucket_to_start() -> None:
    assert world_of(2).run(vote_places, {"num_groups": 3}) == [[0, 0, 1]] * 2
    assert world_of(2).run(vote_places, {}) == [[1]] * 2
    assert world_of(2).run(vote_places, {"op": er.Min}) == [[0]] * 2  # a Min cannot carry it
