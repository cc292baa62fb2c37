"""Whose state a round's sync makes everyone's: rank 0's, or a kept commit's.

At the start of every round the ranks compare, in one collective, which commit each holds
in memory and, for those that hold none, the newest complete commit each can read (a host
snapshot, a file in --checkpoint-dir). When some rank holds a commit, rank 0 does (the
driver's assignment sees to it) and is the root, as ever. When none does — a new job, or
every worker that held it was lost — the newest readable commit is restored by the rank
that reads it and sent to the others: the job goes on from that commit. If the driver
started this round to replace workers that were all lost and no rank finds a commit, every
rank raises SnapshotMissingError: training from scratch in silence is never an option.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from elasticrun.torch import functions, hsdp
from elasticrun.torch.elastic import commit_files, commit_fit, keeper, shard_restore
from elasticrun.torch.elastic.commit_files import (
    CheckpointMismatchError,
    UnreadableCommitError,
)
from elasticrun.torch.elastic.keeper import KeepingSettings, Offer
from elasticrun.torch.elastic.restorable import Restorable
from elasticrun.torch.world import place, runtime
from elasticrun.worker import timeline
from elasticrun.worker.elastic import SnapshotMissingError

log = logging.getLogger("elasticrun.worker")


def sync_root(state: Restorable, generation: int, checksum: int
              ) -> tuple[int | None, int, list[int]]:
    """The rank whose state the round takes (None: every rank holds the same commit, nothing
    to send), the ranks' commit generation after the sync, and each rank's generation
    before it (a sharded state's sync sends each shard from a rank that holds it)."""
    settings = state.keeping_settings
    sharded = state.sharded
    mine: Any = None
    if generation < 0 and settings.keeps:
        mine = _offer_shards(state, settings) if sharded else keeper.offer(settings, state.holding)
        if isinstance(mine, Offer):
            mine = Offer(mine.commit, mine.place, mine.path, _hostname())
    views = functions.allgather_object((generation, checksum, mine))
    generations = [g for g, _, _ in views]
    if all(g < 0 for g in generations):
        if sharded:
            root, restored = _restore_shards(state, settings, [o for _, _, o in views])
            return root, 0, restored
        return _restore(state, settings, [o for _, _, o in views]), 0, generations
    if generation >= 0 and all((g, c) == (generation, checksum) for g, c, _ in views):
        return None, generation, generations
    return 0, 0, generations


def _offer_shards(state: Restorable, settings: KeepingSettings) -> shard_restore.Layouts:
    return shard_restore.found(settings, state.holding, hsdp.layout(), _hostname())


def _restore_shards(state: Restorable, settings: KeepingSettings,
                    views: list[shard_restore.Layouts | None]) -> tuple[int, list[int]]:
    layout = hsdp.layout()
    restored = shard_restore.restore(state, layout, views)
    if restored is not None:
        announce(restored.commit, restored.where)
        return restored.root, restored.generations
    if settings.restore_expected:
        raise _missing(settings, "a commit of every shard index")
    return 0, [-1] * layout.size  # a new job: the root's replica group's shards


def _restore(state: Restorable, settings: KeepingSettings, offers: list[Offer | None]) -> int:
    chosen = keeper.choose(offers)
    if chosen is None:
        if settings.restore_expected:
            raise _missing(settings, "a snapshot of it")
        return 0  # a new job: rank 0's state, as ever
    root, offer = chosen
    content: dict[str, Any] | None = None
    problem: str | None = None
    if place.rank() == root:
        try:
            content = commit_files.read(Path(offer.path))
            model = state.model.state_dict() if state.model is not None else None
            problem = commit_fit.mismatch(content, model, state.optimizer)
        except UnreadableCommitError as exc:
            problem = str(exc)
    problem = functions.broadcast_object(problem, root_rank=root)
    if problem is not None:
        raise CheckpointMismatchError(f"cannot restore commit {offer.commit} from {offer.path}"
                                      f": {problem}")
    if content is not None:
        state.restore_from({"model": content["model"], "optimizer": content["optimizer"],
                            "objects": content["objects"]}, int(content["commit"]))
    announce(offer.commit, offer.where)
    return root


def announce(commit: int, where: str) -> None:
    """Every rank restored commit `commit` (from `where`): logged, on the timeline, and
    told the driver with rank 0's next sync report."""
    log.log(logging.WARNING if place.rank() == 0 else logging.DEBUG,
            "restored the state from the snapshot of commit %d (%s)", commit, where)
    timeline.instant("restored", "elastic", commit=commit, source=where)
    if place.rank() == 0:
        runtime.current().note_restored(commit, where)


def _missing(settings: KeepingSettings, what: str) -> SnapshotMissingError:
    return SnapshotMissingError(
        f"every worker holding the committed training state was lost, and no rank of the new "
        f"round finds {what} (host snapshots: {settings.snapshot_dir or 'off'}; "
        f"--checkpoint-dir: {settings.checkpoint_dir or 'none'})")


def _hostname() -> str:
    return runtime.current().slot.hostname
