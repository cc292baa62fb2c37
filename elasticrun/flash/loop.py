"""Flash commits for a plain training loop (DDP, no trainer): keep these objects' state
every step, give it back after a restart.

    from elasticrun.flash import FlashCommits

    flash = FlashCommits(model=model, optimizer=optimizer, scheduler=scheduler)
    step = flash.restore(step)   # `step`: where the script's own checkpoint left off
    while step < total:
        train_one_step()
        step += 1
        flash.commit(step)

The objects are `torch.distributed.checkpoint`'s `Stateful`s: anything with `state_dict()`
and `load_state_dict()` (a module, an optimizer, a scheduler, a sampler, an object of the
script's own). The ranks' RNG states are kept too. Where every rank holds the same state
(DDP: `replicated=True`, the default) one copy is kept per host; where ranks hold different
state (FSDP2's shards: `replicated=False`), each rank keeps its own part, and a restore
copies each rank's shards back into the DTensors its model and optimizer hold (the same
world size and sharding; a node lost takes its ranks' parts with it, and the script's own
checkpoint decides). Outside elasticrun (plain torchrun, python) it does nothing, and
`restore` returns `step` as given.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from elasticrun.flash.committer import CommitStats
from elasticrun.flash.rng import rng_states, set_rng_states
from elasticrun.flash.session import FlashSession
from elasticrun.torch.elastic.cadence import BUDGET
from elasticrun.torch.elastic.shards import (
    is_dtensor,
    is_sharded,
    load_model_shards,
    optimizer_state,
)


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...


class FlashCommits:
    def __init__(self, replicated: bool = True, budget: float = BUDGET,
                 **objects: Stateful) -> None:
        """`objects`: the state to keep, by name; `budget`: the share of the training time
        commits may take (the cadence: a commit every step while the copy costs less)."""
        if not objects:
            raise ValueError("FlashCommits: name at least one object to keep "
                             "(FlashCommits(model=model, optimizer=optimizer))")
        for name, value in objects.items():
            if not callable(getattr(value, "state_dict", None)) or not callable(
                    getattr(value, "load_state_dict", None)):
                raise TypeError(f"FlashCommits: {name}={type(value).__name__} has no "
                                "state_dict()/load_state_dict()")
        self.objects = objects
        self.session = FlashSession(replicated=replicated, budget=budget)

    @property
    def enabled(self) -> bool:
        return self.session.enabled

    def restore(self, step: int = 0) -> int:
        """Loads the newest flash commit of this job if it is newer than `step`, and
        returns the step to go on from. Every rank calls it (it agrees on the step)."""
        if not self.session.enabled:
            return step
        resumed = self.session.resume(step)
        if resumed is None:
            return step
        state = resumed.shared if self.session.replicated else resumed.own["objects"]
        for name, value in self.objects.items():
            _load(value, state[name])
        if resumed.own is not None:
            set_rng_states(resumed.own["rng"])
        return resumed.step

    def commit(self, step: int) -> bool:
        """Marks the end of step `step`; takes a commit of it when one is due. Whether it
        took one."""
        return self.session.step_ended(step, self._capture)

    def flush(self, timeout: float = 60.0) -> bool:
        """Waits for the commits taken to be written (at most `timeout` s)."""
        return self.session.flush(timeout)

    def stats(self) -> CommitStats | None:
        """What the commits cost and how often they are taken (None: none taken yet)."""
        return self.session.stats()

    def close(self) -> None:
        """Stops the writer thread once the commits taken are written (at exit it stops by
        itself)."""
        self.session.flush()
        self.session.close()

    def _capture(self) -> tuple[Any, Any]:
        state = {name: value.state_dict() for name, value in self.objects.items()}
        if self.session.replicated:
            return state, {"rng": rng_states()}
        return None, {"rng": rng_states(), "objects": state}


def _load(value: Stateful, state: dict[str, Any]) -> None:
    """Loads a kept state; a sharded module's or optimizer's local shards go back into the
    DTensors it holds (its state_dict was kept as local shards)."""
    if isinstance(value, torch.nn.Module) and is_sharded(value):
        load_model_shards(value, state)
    elif isinstance(value, torch.optim.Optimizer) and any(
            is_dtensor(p) for group in value.param_groups for p in group["params"]):
        value.load_state_dict(optimizer_state(value, state))
    else:
        value.load_state_dict(state)

