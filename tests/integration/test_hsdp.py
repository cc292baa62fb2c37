"""Elastic HSDP (issue 57): FSDP2 inside replica groups of --shard-size ranks, elasticrun's
recovery across them. Real jobs: 4 worker processes on two loopback hosts of 2 slots, so
that each host is one replica group; Gloo on CPU; SGD with momentum, so that the job's
result is compared with one process replaying the committed steps (each step's data is a
function of its number and world size, tests/integration/scripts/hsdp_train.py).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

from tests.integration.harness import PYTHON, SCRIPTS, run_job

sys.path.insert(0, str(SCRIPTS))
import hsdp_train  # noqa: E402

TRAIN = str(SCRIPTS / "hsdp_train.py")
TWO_HOSTS = ["-H", "127.0.0.1:2,127.0.0.2:2", "--shard-size", "2"]


def _replay(sizes: dict[int, int]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One process's model and momenta after the committed steps (step -> world size)."""
    model = hsdp_train.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=hsdp_train.LR, momentum=0.9)
    for step in range(1, max(sizes) + 1):
        x, y = hsdp_train.batch(step, sizes[step])
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    params = dict(model.named_parameters())
    momenta = {name: optimizer.state[p]["momentum_buffer"] for name, p in params.items()}
    return params, momenta


def _committed_sizes(records: list[dict]) -> dict[int, int]:
    """step -> the world size it was committed at, as rank 0 saw it (a step done again
    after a rollback counts as done last)."""
    sizes: dict[int, int] = {}
    for record in sorted((r for r in records if r["event"] == "step" and r["rank"] == 0),
                         key=lambda r: r["time"]):
        sizes[record["step"]] = record["size"]
    return sizes


def _assert_matches_replay(log_dir: Path, records: list[dict]) -> dict[int, int]:
    sizes = _committed_sizes(records)
    final = torch.load(log_dir / "final.pt")
    assert final["step"] == max(sizes) == len(sizes)
    params, momenta = _replay(sizes)
    for name, value in params.items():
        torch.testing.assert_close(final["params"][name], value.detach(), rtol=0, atol=1e-6)
        torch.testing.assert_close(final["momenta"][name], momenta[name], rtol=0, atol=1e-6)
    return sizes


def _assert_replicas_agree(records: list[dict]) -> None:
    """In every round, the ranks of one shard index hold the same shard, and every replica
    group the same full parameters (a joining group got each shard of its own index)."""
    by_round: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for record in records:
        if record["event"] == "round":
            by_round[(record["size"], record["step"])].append(record)
    for views in by_round.values():
        assert len({v["full"] for v in views}) == 1, views
        for index in {v["shard_rank"] for v in views}:
            same = [v for v in views if v["shard_rank"] == index]
            assert len({(v["shard"], v["momentum"]) for v in same}) == 1, same


def _job(tmp_path: Path, flags: list[str], env: dict[str, str], timeout: float = 150.0
         ) -> tuple[Path, list[dict]]:
    log_dir = tmp_path / "logs"
    result = run_job(["-np", "4", *TWO_HOSTS, *flags, PYTHON, TRAIN], env, timeout=timeout,
                     log_dir=log_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    return log_dir, result.records


def test_hsdp_2x2_equals_one_process(tmp_path: Path) -> None:
    log_dir, records = _job(tmp_path, [], {"HSDP_STEPS": "8"})
    sizes = _assert_matches_replay(log_dir, records)
    assert set(sizes.values()) == {4}
    rounds = [r for r in records if r["event"] == "round"]
    assert sorted((r["rank"], r["shard_rank"], r["replica_rank"]) for r in rounds) == \
        [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)]
    assert {r["replicas"] for r in rounds} == {2}
    _assert_replicas_agree(records)
    # The shards differ: each rank holds half of the model, not all of it.
    assert len({r["shard"] for r in rounds}) == 2


def test_killed_rank_costs_its_group_which_comes_back(tmp_path: Path) -> None:
    """Rank 3 (group 1) SIGKILLed: its group's other worker is stopped, group 0 goes on
    in-process as one group of 2 (same processes, rolled back to the last commit); group 1
    gets two new workers on its host, which join at a commit and receive their shards from
    group 0."""
    log_dir, records = _job(tmp_path, ["--min-np", "2"],
                            {"HSDP_STEPS": "14", "HSDP_FAULTS": "5:3:sigkill",
                             "HSDP_AWAIT_SIZE": "4", "HSDP_STEP_SLEEP": "0.05"})
    sizes = _assert_matches_replay(log_dir, records)
    assert sizes[1] == 4 and 2 in sizes.values() and sizes[max(sizes)] == 4
    starts = [r for r in records if r["event"] == "start"]
    rounds = [r for r in records if r["event"] == "round"]
    group0 = {r["pid"] for r in rounds if r["replica_rank"] == 0 and r["size"] == 4
              and r["step"] == 0}
    alone = [r for r in rounds if r["size"] == 2]
    assert alone and {r["pid"] for r in alone} == group0  # in-process: the same two workers
    assert any(r["event"] == "restore" and r["pid"] in group0 for r in records)
    assert len(starts) == 6  # four, then two for the refilled group
    back = [r for r in rounds if r["size"] == 4 and r["step"] > 0]
    assert {r["replica_rank"] for r in back} == {0, 1}
    assert {r["pid"] for r in back if r["replica_rank"] == 1}.isdisjoint(group0)
    _assert_replicas_agree(records)


def test_losing_rank_0s_group_leaves_the_other_as_ranks_0_and_1(tmp_path: Path) -> None:
    """Rank 1 SIGKILLed: group 1 goes on alone, its workers now ranks 0 and 1 of the round
    with the shard indices they had (the mesh pointed at a group of other global ranks)."""
    log_dir, records = _job(tmp_path, ["--min-np", "2"],
                            {"HSDP_STEPS": "8", "HSDP_FAULTS": "4:1:sigkill"})
    sizes = _assert_matches_replay(log_dir, records)
    assert sizes[1] == 4 and 2 in sizes.values()  # (then group 0's new workers may join)
    rounds = [r for r in records if r["event"] == "round"]
    first = {r["pid"]: r for r in rounds if r["size"] == 4 and r["step"] == 0}
    alone = [r for r in rounds if r["size"] == 2]
    assert sorted(r["rank"] for r in alone) == [0, 1]
    for record in alone:  # the same processes, the same shard index, other ranks
        before = first[record["pid"]]
        assert before["replica_rank"] == 1 and before["shard_rank"] == record["shard_rank"]


def test_two_rollbacks_to_one_commit_are_exact_and_a_hung_rank_costs_its_group(
        tmp_path: Path) -> None:
    """Rank 1 fails step 4 twice: every rank rolls back to commit 3 two times (restoring
    must copy; an optimizer left holding the commit's tensors would change it). Then rank 2
    stops (SIGSTOP) at step 6: it is found hung and handled as a death of its group, and
    group 0 goes on alone until group 1's new workers join it."""
    log_dir, records = _job(tmp_path, ["--min-np", "2"],
                            {"HSDP_STEPS": "9", "HSDP_FAULTS": "4:1:twice,6:2:sigstop"})
    sizes = _assert_matches_replay(log_dir, records)
    restores = [r for r in records if r["event"] == "restore"]
    assert len([r for r in restores if r["step"] == 3]) >= 8  # two rollbacks on four ranks
    assert sizes[5] == 4 and 2 in sizes.values()
    assert {r["size"] for r in records if r["event"] == "final"} <= {2, 4}
    _assert_replicas_agree(records)


def test_slots_that_cannot_fill_a_group_wait(tmp_path: Path) -> None:
    """A host with one slot cannot hold a replica group of 2: the job runs on the other
    host's group, and nothing is started there."""
    log_dir = tmp_path / "logs"
    result = run_job(["-np", "2", "--min-np", "2", "--max-np", "4", "-H",
                      "127.0.0.1:2,127.0.0.2:1", "--shard-size", "2", PYTHON, TRAIN],
                     {"HSDP_STEPS": "4"}, timeout=120, log_dir=log_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(result.events("start")) == 2
    assert {r["size"] for r in result.events("final")} == {2}
    _assert_matches_replay(log_dir, result.records)


def test_every_worker_killed_restores_the_shards_from_host_snapshots(tmp_path: Path) -> None:
    """Every worker lost at once (one host, two replica groups, every worker SIGKILLed at
    step 5): the driver restarts the job, and each shard index is read back from the host's
    snapshot (a file per shard index) and sent on."""
    log_dir = tmp_path / "logs"
    result = run_job(["-np", "4", "-H", "127.0.0.1:4", "--shard-size", "2", PYTHON, TRAIN],
                     {"HSDP_STEPS": "9", "HSDP_FAULTS": "5:*:sigkill"}, timeout=150,
                     log_dir=log_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "restored from the snapshot of commit" in result.stderr
    records = result.records
    _assert_matches_replay(log_dir, records)
    # A second set of four at least (a rank whose round broke before its own kill kills
    # itself in a later round).
    starts = len([r for r in records if r["event"] == "start"])
    assert starts >= 8
    resumed = [r for r in records if r["event"] == "round" and r["step"] > 0]
    assert resumed and {r["step"] for r in resumed} <= {3, 4}  # the last commit or the one before
    _assert_replicas_agree(records)


def test_a_checkpoint_of_one_shard_size_loads_at_another(tmp_path: Path) -> None:
    """A job of 2 replica groups of 2 keeps its commits in --checkpoint-dir; the same script
    run again as 1 group of 4 goes on from the last one, each rank cutting its own shard."""
    checkpoints = tmp_path / "checkpoints"
    flags = ["--checkpoint-dir", str(checkpoints), "--checkpoint-interval", "0"]
    _, first = _job(tmp_path / "a", flags, {"HSDP_STEPS": "5"})
    log_dir = tmp_path / "b" / "logs"
    result = run_job(["-np", "4", "-H", "127.0.0.1:4", "--shard-size", "4", *flags, PYTHON,
                      TRAIN], {"HSDP_STEPS": "8"}, timeout=150, log_dir=log_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = result.events("round")
    assert {r["step"] for r in resumed} == {5} and {r["shard_rank"] for r in resumed} == \
        {0, 1, 2, 3}
    _assert_matches_replay(log_dir, first + result.records)
    _assert_replicas_agree(result.records)
