"""Restoring sharded state when no rank holds a commit (a new job with --checkpoint-dir, a
total loss): a file per shard index, read by a rank of that index and sent on its cross
group; or, when the files were written at another shard size (or whole), read by every rank
from the shared checkpoint dir and cut to its own shard.

FSDP2 shards a tensor along dim 0 (Shard(0)): shard i of n holds rows [i*c, (i+1)*c) of its
full tensor, c = ceil(rows / n), the last ones fewer or none. Resharding puts the full tensor
back together from the files' shards in index order and takes this rank's rows.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from elasticrun.torch import functions
from elasticrun.torch.elastic import commit_files, commit_fit, shards
from elasticrun.torch.elastic.commit_files import CheckpointMismatchError, UnreadableCommitError
from elasticrun.torch.elastic.keeper import KeepingSettings, Offer
from elasticrun.torch.elastic.restorable import Restorable
from elasticrun.torch.world.replicas import ReplicaLayout

log = logging.getLogger("elasticrun.worker")


@dataclass(frozen=True)
class Layouts:
    """What one rank can read: its own shard index's commits (host dir, checkpoint dir),
    and commits complete in the checkpoint dir at another shard size (commit -> files)."""

    own: list[Offer]
    other: dict[int, list[str]]


def found(settings: KeepingSettings, holding: str, layout: ReplicaLayout, host: str) -> Layouts:
    own_holding = commit_files.shard_holding(holding, layout.shard_rank, layout.shard_size)
    own = [Offer(f.commit, place, str(f.path), host)
           for place, directory in settings.directories()
           for f in commit_files.complete(directory, own_holding)]
    other: dict[int, list[str]] = {}
    if settings.checkpoint_dir is not None:
        by_commit: dict[tuple[int, int], dict[int, str]] = {}
        for f in commit_files.complete(settings.checkpoint_dir):
            parsed = commit_files.parse_shard(f.holding)
            if f.holding == holding:
                other[f.commit] = [str(f.path)]
            elif parsed is not None and parsed[0] == holding and parsed[2] != layout.shard_size:
                by_commit.setdefault((f.commit, parsed[2]), {})[parsed[1]] = str(f.path)
        for (commit, count), paths in by_commit.items():
            if len(paths) == count:
                other[commit] = [paths[i] for i in range(count)]
    return Layouts(own, other)


@dataclass(frozen=True)
class Restored:
    """What a round restored: the root (whose objects the round takes), the ranks'
    generations for the shards' sync (0 where a rank holds its shard of the commit now),
    the commit and where it was read."""

    root: int
    generations: list[int]
    commit: int
    where: str


def restore(state: Restorable, layout: ReplicaLayout, views: list[Layouts | None]
            ) -> Restored | None:
    """Restores the newest commit some rank of every shard index can read (else the newest
    every rank can reshard from the checkpoint dir). None: nothing to restore."""
    count = layout.shard_size
    by_commit: dict[int, dict[int, list[tuple[int, Offer]]]] = {}
    for rank, view in enumerate(views):
        for offer in view.own if view is not None else []:
            by_commit.setdefault(offer.commit, {}).setdefault(rank % count, []).append(
                (rank, offer))
    whole = [commit for commit, per in by_commit.items() if len(per) == count]
    if whole:
        commit = max(whole)
        sources = {index: min(offers, key=lambda o: (o[1].place != "host", o[0]))
                   for index, offers in by_commit[commit].items()}
        source, offer = sources[layout.shard_rank]
        _load(state, [offer.path] if layout.rank == source else [], commit, layout)
        holders = {rank for rank, _ in sources.values()}
        return Restored(sources[0][0], [0 if r in holders else -1 for r in range(layout.size)],
                        commit, offer.where)
    readable = [set(view.other) if view is not None else set() for view in views]
    common = set.intersection(*readable) if readable else set()
    if not common:
        return None
    commit = max(common)
    mine = views[layout.rank]
    assert mine is not None
    _load(state, mine.other[commit], commit, layout)
    return Restored(0, [0] * layout.size, commit,
                    f"checkpoint dir {Path(mine.other[commit][0]).parent} (resharded)")


def _load(state: Restorable, paths: list[str], commit: int, layout: ReplicaLayout) -> None:
    """Every rank takes part (to agree on a problem); ranks given `paths` read and load."""
    problem: str | None = None
    content: dict[str, Any] | None = None
    if paths:
        try:
            contents = [commit_files.read(Path(p)) for p in paths]
            content = contents[0] if len(contents) == 1 and commit_files.parse_shard(
                contents[0]["holding"]) is not None else _reshard(contents, state, layout)
            model = state.model.state_dict() if state.model is not None else None
            local = None if model is None else {k: shards.local_part(v) for k, v in model.items()}
            problem = commit_fit.mismatch(content, local, None)
        except (UnreadableCommitError, ValueError) as exc:
            problem = str(exc)
    problems = [p for p in functions.allgather_object(problem) if p is not None]
    if problems:
        raise CheckpointMismatchError(f"cannot restore commit {commit}: {problems[0]}")
    if content is not None:
        state.restore_from({"model": content["model"], "optimizer": content["optimizer"],
                            "objects": content["objects"]}, int(content["commit"]))


def _reshard(contents: list[dict[str, Any]], state: Restorable,
             layout: ReplicaLayout) -> dict[str, Any]:
    """This rank's shard of a commit kept at another shard size (or whole)."""
    first = contents[0]

    def mine(parts: list[torch.Tensor]) -> torch.Tensor:
        full = torch.cat(parts) if len(parts) > 1 else parts[0]
        rows = math.ceil(full.shape[0] / layout.shard_size) if full.dim() else 0
        start = min(layout.shard_rank * rows, full.shape[0]) if full.dim() else 0
        return full[start:start + rows].clone() if full.dim() else full.clone()

    model = {name: mine([c["model"][name] for c in contents]) for name in first["model"]}
    optimizer = first["optimizer"]
    if optimizer is not None:
        states = {index: {key: mine([c["optimizer"]["state"][index][key] for c in contents])
                          if isinstance(value, torch.Tensor) and value.dim() > 0 else value
                          for key, value in entry.items()}
                  for index, entry in optimizer["state"].items()}
        optimizer = {"state": states, "param_groups": optimizer["param_groups"]}
    return {**first, "model": model, "optimizer": optimizer}
