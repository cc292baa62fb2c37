"""Checks on what elastic_train.py logged: rounds, committed steps, samples, parameters."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path


def read_progress(path: Path) -> tuple[int, int]:
    """[committed step, world size] that rank 0 writes to $PROGRESS_FILE; (0, 0) before."""
    try:
        step, size = json.loads(path.read_text())
        return int(step), int(size)
    except (OSError, ValueError):
        return 0, 0


@dataclass
class RoundView:
    number: int
    size: int
    resume_step: int
    hash: str
    ranks_by_pid: dict[int, int]
    hosts_by_rank: dict[int, str]


def rounds(records: list[dict]) -> list[RoundView]:
    """One view per round, checking that every member started it from the same state."""
    by_round: dict[int, list[dict]] = defaultdict(list)
    for record in records:
        if record["event"] == "round":
            by_round[record["round"]].append(record)
    views = []
    for number in sorted(by_round):
        members = by_round[number]
        sizes = {r["size"] for r in members}
        assert len(sizes) == 1, f"round {number}: members disagree on size {sizes}"
        size = sizes.pop()
        assert sorted(r["rank"] for r in members) == list(range(size)), \
            f"round {number}: ranks {[r['rank'] for r in members]}"
        hashes = {r["hash"] for r in members}
        steps = {r["step"] for r in members}
        assert len(hashes) == 1, f"round {number}: parameters differ across ranks {hashes}"
        assert len(steps) == 1, f"round {number}: ranks resumed at different steps {steps}"
        views.append(RoundView(
            number, size, steps.pop(), hashes.pop(),
            {r["pid"]: r["rank"] for r in members}, {r["rank"]: r["host"] for r in members}))
    return views


def kept_steps(records: list[dict], views: list[RoundView],
               event: str = "step") -> dict[int, list[dict]]:
    """step -> the `event` records that count: those of the round that owns the step."""
    resume = {view.number: view.resume_step for view in views}
    numbers = [view.number for view in views]
    kept: dict[int, list[dict]] = defaultdict(list)
    for record in records:
        if record["event"] != event:
            continue
        number = record["round"]
        later = [n for n in numbers if n > number]
        until = resume[later[0]] if later else float("inf")
        if resume[number] < record["step"] <= until:
            kept[record["step"]].append(record)
    return kept


def check_job(records: list[dict], samples: int, epochs: int | None) -> list[RoundView]:
    """The invariants every elastic job must keep, whatever happened to it. `epochs` None:
    as many as the job trained (a stop file ended it), as its final records say."""
    views = rounds(records)
    assert views, "no round was logged"
    steps = kept_steps(records, views)
    # Which rank fed which samples into a kept step: its "batch" record, written before its
    # gradient joined the step's allreduce. (A rank may die after the allreduce and before
    # logging the step; the step still holds its gradient, and its samples are done.)
    batches = kept_steps(records, views, "batch")

    # Committed state carries across: each round resumes from a state some earlier
    # round committed at exactly that step.
    committed = {(r["step"], r["hash"]) for r in records if r["event"] == "step"}
    for view in views[1:]:
        assert (view.resume_step, view.hash) in committed, \
            f"round {view.number} resumed from a state never committed: {view}"

    # Every sample exactly once per epoch in committed progress. The one exception is the
    # padding ElasticSampler adds (like DistributedSampler) so that all ranks take the same
    # number of steps: repeats in the epoch's last step only, fewer than that step's size.
    per_epoch: dict[int, Counter[int]] = defaultdict(Counter)
    last_of_epoch: dict[int, list[dict]] = {}
    assert set(batches) == set(steps), "kept steps without batch records, or the reverse"
    for step, step_records in sorted(batches.items()):
        ranks = {r["rank"] for r in step_records}
        sizes = {r["size"] for r in step_records}
        assert len(sizes) == 1 and ranks == set(range(sizes.pop())), \
            f"step {step}: records from ranks {sorted(ranks)} only"
        for record in step_records:
            per_epoch[record["epoch"]].update(record["indices"])
            last_of_epoch[record["epoch"]] = step_records
    if epochs is None:
        epochs = max(r["epoch"] for r in records if r["event"] == "final")
    assert sorted(per_epoch) == list(range(epochs)), f"epochs seen: {sorted(per_epoch)}"
    for epoch, counts in per_epoch.items():
        missing = set(range(samples)) - set(counts)
        assert not missing, f"epoch {epoch}: missing {sorted(missing)}"
        repeats = sum(c - 1 for c in counts.values())
        if repeats:
            last = last_of_epoch[epoch]
            in_last = Counter(i for r in last for i in r["indices"])
            padding_ok = repeats < len(last) and all(
                in_last[i] >= 1 for i, c in counts.items() if c > 1)
            assert padding_ok, (f"epoch {epoch}: repeated "
                                f"{ {i: c for i, c in counts.items() if c > 1} } beyond the "
                                f"last step's padding")

    # Training ends with bitwise-identical parameters equal to the last commit.
    finals = [r for r in records if r["event"] == "final"]
    last = views[-1]
    assert len(finals) == last.size, f"{len(finals)} final records for world size {last.size}"
    assert len({r["hash"] for r in finals}) == 1, "final parameters differ across ranks"
    last_step = max(steps)
    assert {r["hash"] for r in steps[last_step]} == {finals[0]["hash"]}
    return views
