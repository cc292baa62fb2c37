"""What restoring a kept commit needs of a training state: the Protocol that `TorchState`
meets, so that the restore (restoring.py, shard_restore.py) depends on it and not on the
state's class, and the state alone knows of the restore."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from elasticrun.torch.elastic.keeper import KeepingSettings


class Restorable(Protocol):
    model: torch.nn.Module | None
    optimizer: torch.optim.Optimizer | None
    holding: str  # what the state's kept commits are named by

    @property
    def sharded(self) -> bool: ...

    @property
    def keeping_settings(self) -> KeepingSettings: ...

    def restore_from(self, saved: dict[str, Any], commit_number: int) -> None: ...
