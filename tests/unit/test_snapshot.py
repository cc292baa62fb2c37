"""Commits: buffers are reused once shapes are stable, copies are independent of the live
tensors, and where GPU copies go is a validated choice."""

from __future__ import annotations

import pytest
import torch

from elasticrun.torch.elastic.snapshot import Placement, fingerprint, snapshot, snapshot_tensors
from elasticrun.torch.elastic.state import TorchState


def test_model_buffers_are_refilled_in_place() -> None:
    live = {"w": torch.ones(3), "b": torch.zeros(2)}
    first = snapshot_tensors(live, None, Placement())
    live["w"].add_(1)
    second = snapshot_tensors(live, first, Placement())
    assert second is first and torch.equal(second["w"], torch.full((3,), 2.0))
    live["w"].add_(1)  # the copy does not follow the live tensor
    assert torch.equal(second["w"], torch.full((3,), 2.0))


def test_a_changed_layout_gets_new_buffers() -> None:
    first = snapshot_tensors({"w": torch.ones(3)}, None, Placement())
    second = snapshot_tensors({"w": torch.ones(4)}, first, Placement())
    assert second is not first and second["w"].shape == (4,)


def test_nested_state_is_copied_and_reused() -> None:
    tree = {"state": {0: {"momentum": torch.ones(2), "step": 3}}, "groups": [{"lr": 0.1}]}
    first = snapshot(tree, None, Placement())
    tree["state"][0]["momentum"].mul_(5)
    second = snapshot(tree, first, Placement())
    assert second["state"][0]["momentum"] is first["state"][0]["momentum"]
    assert torch.equal(second["state"][0]["momentum"], torch.full((2,), 5.0))
    assert second["groups"] == [{"lr": 0.1}] and second["groups"] is not tree["groups"]


@pytest.mark.parametrize("place", ["auto", "device", "host"])
def test_cpu_state_commits_and_restores_wherever_gpu_copies_would_go(place: str) -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = TorchState(model, optimizer, commit_to=place, epoch=1)
    committed = {k: v.clone() for k, v in model.state_dict().items()}
    model(torch.ones(4, 3)).sum().backward()
    optimizer.step()
    state.epoch = 2
    state.restore()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in committed.items())
    assert state.epoch == 1


def test_unknown_place_is_refused() -> None:
    with pytest.raises(ValueError, match=r"commit_to='gpu': expected one of auto, device, host"):
        TorchState(torch.nn.Linear(1, 1), commit_to="gpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64,
                                   torch.uint8, torch.bool, torch.float64])
def test_a_fingerprint_tells_equal_states_from_different_ones(dtype: torch.dtype) -> None:
    def state() -> dict[str, object]:
        return {"model": {"w": torch.arange(7).to(dtype), "one": torch.tensor(1).to(dtype)},
                "optimizer": {0: {"momentum": torch.ones(3, 2).to(dtype).t(), "step": 3}}}

    same, changed = state(), state()
    assert fingerprint(state()) == fingerprint(same)
    changed["model"]["w"][3] = torch.tensor(0).to(dtype)  # type: ignore[index]
    assert fingerprint(changed) != fingerprint(same)
    swapped = state()
    swapped["model"] = {"one": same["model"]["one"], "w": same["model"]["w"]}  # type: ignore[index]
    assert fingerprint(swapped) != fingerprint(same)  # where a tensor sits counts too
    assert 0 <= fingerprint(same) < 1 << 62


def test_a_fingerprint_reads_sparse_tensors() -> None:
    sparse = torch.tensor([[0.0, 2.0], [3.0, 0.0]]).to_sparse()
    assert fingerprint([sparse]) == fingerprint([sparse.clone()])
    assert fingerprint([sparse]) != fingerprint([sparse * 2])
