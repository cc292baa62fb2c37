"""SyncBatchNorm on 2 and 3 real Gloo ranks, each with its own batch size (an empty one
included), against one process's torch BatchNorm on the whole batch."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from elasticrun.torch.sync_batch_norm import SyncBatchNorm
from elasticrun.torch.world import runtime
from tests.collectives.conftest import world_of

CHANNELS = 3
# (trailing dims of one sample, per-rank batch sizes by world size)
_SPATIAL: dict[int, tuple[int, ...]] = {0: (), 1: (5,), 2: (4, 3), 3: (2, 3, 2)}
_BATCHES = {2: [3, 5], 3: [2, 0, 4]}
# (momentum, affine, track_running_stats)
_CONFIGS: list[tuple[float | None, bool, bool]] = [
    (0.1, True, True), (None, True, True), (0.3, False, True), (0.1, True, False)]


def _data(spatial: tuple[int, ...], total: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn((total, CHANNELS, *spatial), generator=generator, dtype=torch.float64)
    x = x * 3 + 2  # far from normal, so that the statistics matter
    grad = torch.randn((total, CHANNELS, *spatial), generator=generator, dtype=torch.float64)
    return x, grad


def _seed(dims: int, config: int, step: int) -> int:
    return step + 10 * dims + 100 * config


def _module(cls: Any, momentum: float | None, affine: bool, track: bool) -> torch.nn.Module:
    module = cls(CHANNELS, momentum=momentum, affine=affine, track_running_stats=track)
    module = module.double()
    if affine:
        with torch.no_grad():
            module.weight.copy_(torch.tensor([0.5, -1.0, 2.0]))
            module.bias.copy_(torch.tensor([0.1, 0.0, -0.3]))
    return module


def _step(module: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor) -> dict[str, Any]:
    x = x.clone().requires_grad_(True)
    out = module(x)
    (out * grad).sum().backward()
    state = {"out": out.detach(), "dx": x.grad}
    weight = getattr(module, "weight", None)
    if weight is not None:
        state["dw"] = weight.grad.clone()
        state["db"] = module.bias.grad.clone()
        weight.grad = None
        module.bias.grad = None
    return state


def _train(cls: Any, batches: list[int], rank: int | None) -> list[dict[str, Any]]:
    """Two training steps and one eval step for every config and input rank, on this
    rank's share of the batch (rank None: the whole batch)."""
    results: list[dict[str, Any]] = []
    for dims, spatial in _SPATIAL.items():
        bn_cls = {0: torch.nn.BatchNorm1d, 1: torch.nn.BatchNorm1d, 2: torch.nn.BatchNorm2d,
                  3: torch.nn.BatchNorm3d}[dims] if cls is None else cls
        for index, (momentum, affine, track) in enumerate(_CONFIGS):
            module = _module(bn_cls, momentum, affine, track)
            steps = []
            for seed in (1, 2, 3):
                x, grad = _data(spatial, sum(batches), _seed(dims, index, seed))
                if rank is not None:
                    start = sum(batches[:rank])
                    x, grad = x[start:start + batches[rank]], grad[start:start + batches[rank]]
                module.train(seed != 3)
                steps.append(_step(module, x, grad))
            if track:
                steps.append({"mean": module.running_mean.clone(),
                              "var": module.running_var.clone(),
                              "batches": int(module.num_batches_tracked)})
            results.append({"case": (dims, momentum, affine, track), "steps": steps})
    return results


def _train_on_rank(batches: list[int]) -> list[dict[str, Any]]:
    return _train(SyncBatchNorm, batches, runtime.current().slot.rank)


def _share(full: torch.Tensor, batches: list[int], rank: int) -> torch.Tensor:
    start = sum(batches[:rank])
    return full[start:start + batches[rank]]


def _alone(case: tuple[Any, ...], seed: int, batches: list[int], rank: int) -> dict[str, Any]:
    """Eval mode without running statistics: the rank's own batch statistics (eval never
    synchronises)."""
    dims, momentum, affine, track = case
    module = _module(torch.nn.BatchNorm3d, momentum, affine, track).eval()
    x, grad = _data(_SPATIAL[dims], sum(batches), seed)
    x = _share(x, batches, rank).clone().requires_grad_(True)
    out = torch.nn.functional.batch_norm(x, None, None, module.weight, module.bias, True,
                                         0.0, module.eps)
    (out * _share(grad, batches, rank)).sum().backward()
    return {"out": out.detach(), "dx": x.grad}


@pytest.mark.parametrize("size", [2, 3])
def test_sync_batch_norm_equals_batch_norm_on_the_whole_batch(size: int) -> None:
    batches = _BATCHES[size]
    per_rank = world_of(size).run(_train_on_rank, batches)
    expected = _train(None, batches, None)
    close = {"rtol": 1e-9, "atol": 1e-10}
    for case_index, want in enumerate(expected):
        case = want["case"]
        for step_index, want_step in enumerate(want["steps"]):
            where = (case, step_index)
            for rank in range(size):
                got = per_rank[rank][case_index]["steps"][step_index]
                if "mean" in want_step:  # running statistics, the same on every rank
                    assert torch.allclose(got["mean"], want_step["mean"], **close), where
                    assert torch.allclose(got["var"], want_step["var"], **close), where
                    assert got["batches"] == want_step["batches"], where
                    continue
                if step_index == 2 and not case[3]:
                    seed = _seed(case[0], _CONFIGS.index(case[1:]), 3)
                    alone = _alone(case, seed, batches, rank)
                    for key in ("out", "dx"):
                        assert torch.allclose(got[key], alone[key], **close), (where, key)
                    continue
                for key in ("out", "dx"):
                    mine = _share(want_step[key], batches, rank)
                    assert got[key].shape == mine.shape, (where, key)
                    assert torch.allclose(got[key], mine, **close), (where, rank, key)
            # each rank's share of the weight gradients (not for an eval step on local stats)
            if "dw" in want_step and (step_index < 2 or case[3]):
                for key in ("dw", "db"):
                    summed = sum(per_rank[r][case_index]["steps"][step_index][key]
                                 for r in range(size))
                    assert torch.allclose(summed, want_step[key], **close), (where, key)


def test_a_world_of_one_and_eval_mode_are_plain_batch_norm(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = SimpleNamespace(slot=SimpleNamespace(rank=0, size=1))
    monkeypatch.setattr(runtime, "_runtime", fake)
    mine, want = _train(SyncBatchNorm, [6], 0), _train(None, [6], None)
    for got_case, want_case in zip(mine, want, strict=True):
        for got, expected in zip(got_case["steps"], want_case["steps"], strict=True):
            for key, value in expected.items():
                if isinstance(value, torch.Tensor):
                    assert torch.equal(got[key], value), (want_case["case"], key)
                else:
                    assert got[key] == value


def test_inputs_it_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = SimpleNamespace(slot=SimpleNamespace(rank=0, size=1))
    monkeypatch.setattr(runtime, "_runtime", fake)
    with pytest.raises(ValueError, match="expected at least 2D input"):
        SyncBatchNorm(3)(torch.randn(3))
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        SyncBatchNorm(3)(torch.randn(1, 3))
