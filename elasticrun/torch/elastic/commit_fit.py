"""Whether a commit fits this job: its model's and optimizer's names and shapes against theirs.

A kept commit is loaded only into a model and optimizer of the shapes it was written from;
`mismatch` names, in one line, the first difference (its callers raise
commit_files.CheckpointMismatchError with it, before anything is loaded).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def mismatch(content: Mapping[str, Any], model: Mapping[str, torch.Tensor] | None,
             optimizer: torch.optim.Optimizer | None) -> str | None:
    """What makes `content` not loadable into this model and optimizer (None: it fits), in
    one line: the first parameter, group or state whose name or shape differs."""
    if model is not None:
        problem = _model_difference(content.get("model"), model)
        if problem is not None:
            return problem
    if optimizer is not None:
        return _optimizer_difference(content.get("optimizer"), optimizer)
    return None


def _model_difference(there: Any, here: Mapping[str, torch.Tensor]) -> str | None:
    if not isinstance(there, Mapping):
        return "the file holds no model state"
    missing = [name for name in here if name not in there]
    if missing:
        return f"model parameter {missing[0]!r} is not in the file"
    extra = [name for name in there if name not in here]
    if extra:
        return f"the file's model has {extra[0]!r}, this model has not"
    for name, tensor in here.items():
        theirs = there[name]
        if not isinstance(theirs, torch.Tensor) or theirs.shape != tensor.shape \
                or theirs.dtype != tensor.dtype:
            return f"model parameter {name!r} is {_shape(theirs)} in the file, " \
                   f"{_shape(tensor)} in this model"
    return None


def _optimizer_difference(there: Any, optimizer: torch.optim.Optimizer) -> str | None:
    if not isinstance(there, Mapping) or "param_groups" not in there:
        return "the file holds no optimizer state"
    groups = there["param_groups"]
    if len(groups) != len(optimizer.param_groups):
        return f"the file's optimizer has {len(groups)} parameter group(s), this one " \
               f"{len(optimizer.param_groups)}"
    shapes: dict[int, torch.Size] = {}
    for index, (theirs, mine) in enumerate(zip(groups, optimizer.param_groups, strict=True)):
        if len(theirs["params"]) != len(mine["params"]):
            return f"optimizer parameter group {index} has {len(theirs['params'])} " \
                   f"parameter(s) in the file, {len(mine['params'])} here"
        shapes.update({key: p.shape for key, p in zip(theirs["params"], mine["params"],
                                                      strict=True)})
    for key, values in there.get("state", {}).items():
        for name, value in values.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 \
                    and value.shape != shapes.get(key):
                return f"optimizer state {name!r} of parameter {key} is {_shape(value)} in " \
                       f"the file, its parameter {list(shapes.get(key, ()))} here"
    return None


def _shape(value: Any) -> str:
    if not isinstance(value, torch.Tensor):
        return type(value).__name__
    return f"{list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
