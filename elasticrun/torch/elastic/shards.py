"""Sharded state (DTensors, as FSDP2 makes them): a commit keeps each rank's local shards,
a restore copies them back into the tensors the model and the optimizer already hold.

Restoring never hands a committed tensor to the model or the optimizer: an optimizer keeps
the tensors it is given and updates them in place, which would change the commit (and a
second rollback to it would be wrong). DTensor ops have no sharding strategy for fused
copies, so copies are made of the local tensors.
"""

from __future__ import annotations

import sys
from typing import Any

import torch


def _dtensor_type() -> type | None:
    module = sys.modules.get("torch.distributed.tensor")  # no DTensor exists without it
    return getattr(module, "DTensor", None) if module is not None else None


def is_dtensor(value: Any) -> bool:
    kind = _dtensor_type()
    return kind is not None and isinstance(value, kind)


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (the tensor itself otherwise)."""
    if is_dtensor(tensor):
        local: torch.Tensor = tensor.to_local()  # type: ignore[attr-defined]
        return local
    return tensor


def is_sharded(model: torch.nn.Module | None) -> bool:
    return model is not None and any(is_dtensor(p) for p in model.parameters())


@torch.no_grad()
def load_model_shards(model: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
    """Copies committed local shards into the model's tensors, in place."""
    current = model.state_dict()
    if current.keys() != saved.keys():
        missing = sorted(current.keys() ^ saved.keys())
        raise RuntimeError(f"the committed model does not fit this one: {missing[:3]} differ")
    for name, tensor in current.items():
        local_part(tensor).copy_(saved[name])


def optimizer_state(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state_dict to load from a committed one of local shards: a state tensor
    with the shape of its parameter's local shard becomes a DTensor laid out as the
    parameter is (a copy: the commit stays the commit's)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state: dict[Any, Any] = {}
    for index, entry in saved["state"].items():
        param = params[index]
        state[index] = {key: _like(param, value) for key, value in entry.items()}
    return {"state": state, "param_groups": saved["param_groups"]}


def _like(param: Any, value: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    copy = value.detach().clone()
    if not is_dtensor(param) or value.dim() == 0 or value.shape != local_part(param).shape:
        return copy
    kind: Any = _dtensor_type()
    return kind.from_local(copy, param.device_mesh, param.placements, run_check=False,
                           shape=param.shape, stride=param.stride())
