"""TorchState: model, optimizer and any other objects, committed in memory.

A commit copies into buffers kept from the previous commit (no new allocations once
shapes are stable); copies of GPU tensors stay on the GPU or go to pinned host memory
(`commit_to`, snapshot.py). Objects with `state_dict`/`load_state_dict` (ElasticSampler,
LR schedulers) are committed through those; anything else by deep copy.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from elasticrun.torch import functions, hsdp
from elasticrun.torch.elastic import commit_files, restoring, shard_sync, shards
from elasticrun.torch.elastic.commit_files import WHOLE
from elasticrun.torch.elastic.keeper import CommitKeeper, KeepingSettings
from elasticrun.torch.elastic.snapshot import (
    Placement,
    fingerprint,
    snapshot,
    snapshot_tensors,
)
from elasticrun.torch.world import groups, place, plane, runtime
from elasticrun.worker.elastic import Backend, ObjectState, State

__all__ = ["ObjectState", "TorchState"]  # Horovod's horovod.torch.elastic.state

_RESERVED = {"model", "optimizer", "holding"}
_made = itertools.count()  # TorchStates made in this process


def _copies_done() -> Callable[[], None] | None:
    """What the writer thread waits on before it reads the commit's copies: the copies a
    commit launched on the GPU (on this thread's stream) are complete then."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    event = torch.cuda.Event()
    event.record()
    return event.synchronize


def keeper_for(settings: KeepingSettings) -> CommitKeeper | None:
    """A writer for one state's commits, or None when nothing is kept. The last commit is
    kept when the process ends normally (bounded)."""
    if not settings.keeps:
        return None
    keeper = CommitKeeper(settings)
    atexit.register(keeper.flush, 30.0)
    return keeper


def _stateful(value: Any) -> bool:
    return hasattr(value, "state_dict") and hasattr(value, "load_state_dict")


class TorchState(State):
    """`TorchState(model=None, optimizer=None, **objects)`; objects are attributes,
    e.g. `state.epoch`, `state.sampler`. `commit_to` says where commits keep copies of GPU
    tensors: "device", "host" (pinned memory) or "auto" (the device while the GPU has room
    for the copy twice over)."""

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        backend: Backend | None = None,
        commit_to: str = "auto",
        **objects: Any,
    ) -> None:
        super().__init__(backend)
        self._placement = Placement(commit_to)
        self.model = model
        self.optimizer = optimizer
        self._object_names = list(objects)
        for name, value in objects.items():
            setattr(self, name, value)
        self._saved: dict[str, Any] = {}
        # The job's count of commits (kept in snapshots and synced from the root).
        self._commit_number = 0
        # What this state's kept commits are named by: the state's place among the process's
        # TorchStates (scripts make them in the same order on every rank and after a
        # restart), so that one state never restores another's commits.
        made = next(_made)
        self.holding = WHOLE if made == 0 else f"{WHOLE}-{made}"
        self._settings = KeepingSettings.from_env()
        self._sharded = shards.is_sharded(model)
        # A sharded state's ranks decide together when a commit goes to --checkpoint-dir
        # (every shard index must have it); their copiers then copy what they are given.
        self._keeper = keeper_for(replace(self._settings, checkpoint_interval=0.0)
                                  if self._sharded else self._settings)
        self._last_checkpoint = time.monotonic()
        # Which commit `_saved` holds, counted since the ranks' states were last made equal
        # (None: never). Ranks with the same count hold the same model and optimizer.
        self._generation: int | None = None
        self._copy_state()  # what a failure before the first sync rolls back to: no commit

    def _object_states(self) -> dict[str, Any]:
        states = {}
        for name in self._object_names:
            value = getattr(self, name)
            states[name] = value.state_dict() if _stateful(value) else value
        return states

    def _load_objects(self, states: dict[str, Any]) -> None:
        for name, value in states.items():
            current = getattr(self, name, None)
            if current is not None and _stateful(current):
                current.load_state_dict(value)
            else:
                setattr(self, name, value)

    def save(self) -> None:
        """Copies the model's and the optimizer's state and the other attributes into
        memory (GPU tensors where `commit_to` says), and has it kept outside the process
        (a host snapshot, --checkpoint-dir) off the training thread."""
        self._commit_number += 1
        self._copy_state()
        self._keep()

    @property
    def sharded(self) -> bool:
        """Whether the model's parameters are DTensors (FSDP): commits hold local shards."""
        return self._sharded

    @property
    def keeping_settings(self) -> KeepingSettings:
        """Where this state's commits are kept (host snapshots, --checkpoint-dir)."""
        return self._keeper.settings if self._keeper is not None else self._settings

    def _keep(self) -> None:
        if self._keeper is None or not runtime.is_initialized():
            return
        if not self._sharded:
            self._keeper.kept(self._commit_number, self.holding, self._saved,
                              host_writer=place.local_rank() == 0,
                              checkpoint_writer=place.rank() == 0, ready=_copies_done())
            return
        # Each shard index is written by the host's first replica group, and by replica
        # group 0 to the checkpoint dir.
        layout = hsdp.layout()
        holding = commit_files.shard_holding(self.holding, layout.shard_rank,
                                             layout.shard_size)
        self._keeper.kept(self._commit_number, holding, self._saved,
                          host_writer=place.local_rank() < layout.shard_size,
                          checkpoint_writer=layout.replica_rank == 0, ready=_copies_done(),
                          checkpoint_due=self._checkpoint_due())

    def _checkpoint_due(self) -> bool:
        """Rank 0's word (one scalar broadcast) on whether this commit goes to the checkpoint
        dir: once every --checkpoint-interval seconds."""
        if self._settings.checkpoint_dir is None:
            return False
        due = torch.tensor([time.monotonic() - self._last_checkpoint
                            >= self._settings.checkpoint_interval], dtype=torch.int32)
        plane.broadcast(due, src=0)
        if due.item():
            self._last_checkpoint = time.monotonic()
        return bool(due.item())

    def _copy_state(self) -> None:
        self._placement.settle()  # the last commit's copies complete before they are reused
        with self._keeper.hold() if self._keeper is not None else contextlib.nullcontext():
            self._refill()

    def _refill(self) -> None:
        saved: dict[str, Any] = {}
        if self.model is not None:
            saved["model"] = snapshot_tensors(self.model.state_dict(), self._saved.get("model"),
                                              self._placement)
        if self.optimizer is not None:
            saved["optimizer"] = snapshot(self.optimizer.state_dict(),
                                          self._saved.get("optimizer"), self._placement)
        saved["objects"] = snapshot(self._object_states(), self._saved.get("objects"),
                                    self._placement)
        self._placement.copied()
        self._saved = saved
        if self._generation is not None:
            self._generation += 1

    def restore_from(self, saved: dict[str, Any], commit_number: int) -> None:
        """Takes a commit read from a snapshot or checkpoint as the last commit, and loads
        it."""
        self._saved = saved
        self._commit_number = commit_number
        self.restore()

    def restore(self) -> None:
        """Loads the last saved copies into the model, the optimizer and the other
        attributes."""
        # Loading must copy: an optimizer keeps the tensors it is given and updates them
        # in place, which would silently change the commit.
        self._placement.settle()
        if self.sharded:
            assert self.model is not None
            hsdp.reset_iterations(self.model)  # a failure mid-step left FSDP mid-step
            shards.load_model_shards(self.model, self._saved["model"])
            if self.optimizer is not None:
                self.optimizer.load_state_dict(
                    shards.optimizer_state(self.optimizer, snapshot(self._saved["optimizer"])))
        else:
            if self.model is not None:
                self.model.load_state_dict(self._saved["model"])
            if self.optimizer is not None:
                self.optimizer.load_state_dict(snapshot(self._saved["optimizer"]))
        self._load_objects(snapshot(self._saved["objects"]))

    def sync(self) -> None:
        """Makes every rank's state the root's (rank 0, or the rank that restores the newest
        snapshot when no rank holds a commit), then commits it. Model and optimizer are not
        sent when every rank holds the same commit (after a reset that added no one): they
        are equal already."""
        generation = -1 if self._generation is None else self._generation
        unsettled = groups.take_unsettled()
        sharded = self.sharded
        # Every rank takes part in the check, a rank that never synced too. After an NCCL
        # group was cut, equal commit counts may hide tensors that differ (a reduction cut
        # midway): the ranks compare checksums of what they hold too (whole state only:
        # shards differ by design).
        checksum = fingerprint(self._tensor_states()) if unsettled and not sharded else 0
        root, generation, generations = restoring.sync_root(self, generation, checksum)
        if root is not None and sharded:
            shard_sync.sync_shards(self.model, self.optimizer, generations, root)
        elif root is not None and (self.model is not None or self.optimizer is not None):
            self._broadcast_tensors(root)
        self._generation = generation
        self._sync_objects(root or 0)
        self._copy_state()
        self._keep()

    def _tensor_states(self) -> list[Any]:
        return [None if self.model is None else self.model.state_dict(),
                None if self.optimizer is None else self.optimizer.state_dict()["state"]]

    def _broadcast_tensors(self, root: int) -> None:
        if self.model is not None:
            functions.broadcast_parameters(self.model.state_dict(), root_rank=root)
        if self.optimizer is not None:
            functions.broadcast_optimizer_state(self.optimizer, root_rank=root)

    def _sync_objects(self, root: int) -> None:
        states, self._commit_number = functions.broadcast_tree(
            (self._object_states(), self._commit_number), root_rank=root)
        if self._object_names:
            self._load_objects(states)

    def __setattr__(self, name: str, value: Any) -> None:
        # New public attributes set after construction (state.batch = 0) are committed too.
        if not name.startswith("_") and name not in _RESERVED and \
                "_object_names" in self.__dict__ and name not in self._object_names:
            self._object_names.append(name)
        super().__setattr__(name, value)
