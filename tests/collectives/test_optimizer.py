"""DistributedOptimizer on real Gloo ranks: reduction from the gradient hooks gives the same
parameters as reduction at step(), bitwise; no gradient is lost across
backward_passes_per_step or a reset; Horovod's arguments mean what they mean there."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import elasticrun.torch as hvd
from elasticrun.torch.world import runtime
from tests.collectives.conftest import world_of


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 6 * 6, 64), nn.ReLU(), nn.Linear(64, 10))


def _batch(rank: int, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(rank * 1000 + step * 10 + micro)
    return (torch.randn(4, 3, 8, 8, generator=generator),
            torch.randint(0, 10, (4,), generator=generator))


def _train(steps: int, passes: int, **options: object) -> list[torch.Tensor]:
    model = _model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1,
                                                         momentum=0.9),
                                         named_parameters=model.named_parameters(),
                                         backward_passes_per_step=passes, **options)
    for step in range(steps):
        optimizer.zero_grad()
        for micro in range(passes):
            x, y = _batch(hvd.rank(), step, micro)
            nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def _plain_average_reference(steps: int, passes: int) -> list[torch.Tensor]:
    """Every rank's gradients computed here, averaged per parameter: no elasticrun at all
    (BatchNorm's running stats are local, and do not enter the gradients)."""
    size = hvd.size()
    replicas = [_model() for _ in range(size)]
    reference = _model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        for replica in replicas:
            replica.load_state_dict(reference.state_dict())
            replica.zero_grad()
        for rank, replica in enumerate(replicas):
            for micro in range(passes):
                x, y = _batch(rank, step, micro)
                nn.functional.cross_entropy(replica(x), y).backward()
        for p, *copies in zip(reference.parameters(), *[r.parameters() for r in replicas],
                              strict=True):
            p.grad = torch.stack([c.grad for c in copies]).sum(0) / size
        optimizer.step()
    return [p.detach().clone() for p in reference.parameters()]


def check_hooks_match_step_time_reduction(passes: int) -> bool:
    with_hooks = _train(3, passes)
    at_step = _train(3, passes, overlap=False)
    assert all(torch.equal(a, b) for a, b in zip(with_hooks, at_step, strict=True)), \
        "hook-driven reduction differs from step-time reduction"
    reference = _plain_average_reference(3, passes)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(with_hooks, reference,
                                                                strict=True))
    everyone = hvd.allgather_object([t.sum().item() for t in with_hooks])
    assert all(e == everyone[0] for e in everyone), "ranks disagree"
    return True


def check_horovod_options() -> bool:
    plain = _train(2, 1)
    predivided = _train(2, 1, gradient_predivide_factor=float(hvd.size()))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, predivided, strict=True))
    grouped = _train(2, 1, num_groups=2)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, grouped, strict=True))
    fp16 = _train(2, 1, compression=hvd.Compression.fp16)
    assert all(torch.allclose(a, b, atol=1e-2) for a, b in zip(plain, fp16, strict=True))
    adasum = _train(2, 1, op=hvd.Adasum)
    everyone = hvd.allgather_object([t.sum().item() for t in adasum])
    assert all(e == everyone[0] for e in everyone), "Adasum left the ranks apart"
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        _train(1, 1, op=hvd.Sum, gradient_predivide_factor=2.0)
    return True


def check_synchronize_then_clip_and_guards() -> bool:
    model = _model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = _batch(hvd.rank(), 0)
    nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        optimizer.zero_grad()
    optimizer.synchronize()
    grads = [p.grad.clone() for p in model.parameters()]
    everyone = hvd.allgather_object([g.sum().item() for g in grads])
    assert all(e == everyone[0] for e in everyone), "synchronize() did not reduce"
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    with optimizer.skip_synchronize():
        optimizer.step()
    nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(AssertionError, match="more than backward_passes_per_step"):
        nn.functional.cross_entropy(model(x), y).backward()
    optimizer.synchronize()
    return True


def check_a_new_round_keeps_the_accumulated_gradient() -> bool:
    """A reset between two passes of a step (a host change at a commit between them): the
    gradient accumulated so far is not lost, and is reduced in the new round's step."""
    model = _model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         backward_passes_per_step=2)
    x, y = _batch(hvd.rank(), 0)
    nn.functional.cross_entropy(model(x), y).backward()  # the first pass: nothing starts
    local = [p.grad.clone() for p in model.parameters()]
    session = runtime.current().session
    assert session is not None
    session.number += 1  # what a reset does to this worker's view of the round
    try:
        optimizer.synchronize()  # every bucket starts, in the "new" round
    finally:
        session.number -= 1
    reduced = [p.grad for p in model.parameters()]
    total = [hvd.allreduce(g, op=hvd.Sum) for g in local]
    size = hvd.size()
    assert all(torch.allclose(r, t / size, atol=1e-6) for r, t in zip(reduced, total,
                                                                       strict=True))
    return True


def check_optimizer_state_broadcast() -> bool:
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01 * (hvd.rank() + 1))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    if hvd.rank() == 0:  # only the root has per-parameter state (exp_avg, step...)
        x, y = _batch(0, 0)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        scheduler.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    state = optimizer.state_dict()
    summary = [state["param_groups"][0]["lr"],
               sorted((k, float(v["exp_avg"].sum())) for k, v in state["state"].items())]
    everyone = hvd.allgather_object(summary)
    assert all(e == everyone[0] for e in everyone), everyone
    assert everyone[0][0] == pytest.approx(0.005)
    return True


@pytest.mark.parametrize(("size", "passes"), [(2, 1), (3, 2)])
def test_reduction_from_hooks_equals_reduction_at_step(size: int, passes: int) -> None:
    assert world_of(size).run(check_hooks_match_step_time_reduction, passes) == [True] * size


def test_horovod_optimizer_options() -> None:
    assert world_of(3).run(check_horovod_options) == [True] * 3


def test_synchronize_clip_skip_synchronize_and_guards() -> None:
    assert world_of(2).run(check_synchronize_then_clip_and_guards) == [True] * 2


def test_a_reset_keeps_the_accumulated_gradient() -> None:
    assert world_of(2).run(check_a_new_round_keeps_the_accumulated_gradient) \
        == [True] * 2


def test_optimizer_state_and_scheduler_lr_come_from_the_root() -> None:
    assert world_of(3).run(check_optimizer_state_broadcast) == [True] * 3
