"""FlashCommits (the plain loop's API) on real state: kept in host memory by its writer
thread, given back exactly (weights, optimizer, RNG) by a new process of the same job, and
agreed by two real Gloo ranks whose hosts hold different commits (one of them a new host
with none: it receives the state from its peer)."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from elasticrun import protocol
from elasticrun.flash import FlashCommits
from elasticrun.flash.store import SHARED, FlashStore


def training(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: range,
          flash: FlashCommits | None) -> None:
    for step in steps:
        x = torch.randn(4, 8)  # the global RNG: restored with the commit
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
        if flash is not None:
            flash.commit(step)


@pytest.fixture
def snapshot_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(protocol.ENV_SNAPSHOT_DIR, str(tmp_path))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return tmp_path


def test_a_restarted_process_goes_on_exactly_where_the_last_commit_was(
        snapshot_dir: Path) -> None:
    model, optimizer = training()
    flash = FlashCommits(model=model, optimizer=optimizer)
    assert flash.enabled and flash.restore(0) == 0  # nothing kept yet
    train(model, optimizer, range(1, 8), flash)
    assert flash.flush()
    stats = flash.stats()
    assert stats is not None and stats.commits >= 1
    kept = FlashStore(snapshot_dir / "flash").steps(SHARED)
    assert kept and len(kept) <= 2 and kept[-1] <= 7
    last = kept[-1]
    expected_model, expected_optimizer = training()  # the same run, uninterrupted
    train(expected_model, expected_optimizer, range(1, 12), None)

    model, optimizer = training(seed=1)  # a new process: other weights, other RNG
    again = FlashCommits(model=model, optimizer=optimizer)
    assert again.restore(0) == last
    assert again.restore(last) == last  # the script's own checkpoint as new: it decides
    model, optimizer = training(seed=1)
    again = FlashCommits(model=model, optimizer=optimizer)
    assert again.restore(0) == last
    train(model, optimizer, range(last + 1, 12), None)
    for ours, theirs in zip(model.parameters(), expected_model.parameters(), strict=True):
        assert torch.equal(ours, theirs)


def test_outside_elasticrun_it_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(protocol.ENV_SNAPSHOT_DIR, raising=False)
    model, optimizer = training()
    flash = FlashCommits(model=model, optimizer=optimizer)
    assert not flash.enabled and flash.restore(5) == 5 and not flash.commit(6)


def test_what_is_not_stateful_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="step=int has no state_dict"):
        FlashCommits(step=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name at least one object"):
        FlashCommits()


def test_a_torn_commit_is_never_read(snapshot_dir: Path) -> None:
    model, optimizer = training()
    flash = FlashCommits(model=model, optimizer=optimizer)
    train(model, optimizer, range(1, 6), flash)
    assert flash.flush()
    store = FlashStore(snapshot_dir / "flash")
    newest = store.steps(SHARED)[-1]
    path = snapshot_dir / "flash" / os.readlink(
        snapshot_dir / "flash" / f"commit-{newest:012d}.{SHARED}.pt")
    path.write_bytes(path.read_bytes()[:100])  # as if its writer died midway
    assert store.read(newest, SHARED) is None


def run_ranks(target: Any, args: list[tuple[Any, ...]]) -> list[Any]:
    """Runs `target(rank, *args[rank], results)` in a spawned process per rank; their
    results, sorted. A rank that dies fails the test at once, with its exit code."""
    context = mp.get_context("spawn")
    results = context.Queue()
    ranks = [context.Process(target=target, args=(rank, *rank_args, results))
             for rank, rank_args in enumerate(args)]
    for process in ranks:
        process.start()
    got: list[Any] = []
    deadline = time.monotonic() + 180
    try:
        while len(got) < len(ranks):
            try:
                got.append(results.get(timeout=0.5))
            except queue.Empty:
                dead = [(r, p.exitcode) for r, p in enumerate(ranks) if p.exitcode]
                assert not dead, f"rank(s) died: {dead}"
                assert time.monotonic() < deadline, "the ranks did not answer in 180 s"
    finally:
        for process in ranks:
            process.join(30)
            if process.is_alive():
                process.kill()
    return sorted(got)


def _rank(rank: int, store_path: str, directories: list[str], results: Any) -> None:
    import torch.distributed as dist

    os.environ.update({"RANK": str(rank), "LOCAL_RANK": "0",
                       protocol.ENV_SNAPSHOT_DIR: directories[rank]})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank,
                            world_size=2)
    try:
        model, optimizer = training(seed=rank + 5)
        flash = FlashCommits(model=model, optimizer=optimizer)
        step = flash.restore(0)
        results.put((rank, step, [p.detach().tolist() for p in model.parameters()]))
    finally:
        dist.destroy_process_group()


def test_two_hosts_agree_and_a_new_host_gets_the_state_from_its_peer(tmp_path: Path,
                                                                      monkeypatch:
                                                                      pytest.MonkeyPatch
                                                                      ) -> None:
    """Host 0 holds commits 6 and 7; host 1 is new (nothing kept): both resume at 7 with
    host 0's weights."""
    host0, host1 = tmp_path / "host0", tmp_path / "host1"
    monkeypatch.setenv(protocol.ENV_SNAPSHOT_DIR, str(host0))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    model, optimizer = training()
    flash = FlashCommits(model=model, optimizer=optimizer)
    train(model, optimizer, range(1, 8), flash)
    assert flash.flush()
    kept = FlashStore(host0 / "flash").steps(SHARED)
    expected = FlashStore(host0 / "flash").read(kept[-1], SHARED)
    assert expected is not None
    got = run_ranks(_rank, [(str(tmp_path / "store"), [str(host0), str(host1)])] * 2)
    weights = list(expected["state"]["model"].values())
    for rank, step, parameters in got:
        assert step == kept[-1], rank
        for ours, theirs in zip(parameters, weights, strict=True):
            assert torch.equal(torch.tensor(ours), theirs)


def _fsdp_rank(rank: int, store_path: str, directory: str, results: Any) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from elasticrun.torch.elastic.shards import local_part

    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank),
                       protocol.ENV_SNAPSHOT_DIR: directory})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank,
                            world_size=2)
    try:
        def sharded(seed: int) -> tuple[nn.Module, torch.optim.Optimizer, FlashCommits]:
            torch.manual_seed(seed)
            model = fully_shard(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
            optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
            return model, optimizer, FlashCommits(replicated=False, model=model,
                                                  optimizer=optimizer)

        model, optimizer, flash = sharded(0)
        assert flash.restore(0) == 0
        shards = {}
        for step in range(1, 9):
            train(model, optimizer, range(step, step + 1), flash)
            shards[step] = [local_part(p).detach().clone() for p in model.parameters()]
        assert flash.flush()
        again, again_optimizer, again_flash = sharded(7)  # other weights, the same layout
        step = again_flash.restore(0)
        same = all(torch.equal(local_part(p), kept)
                   for p, kept in zip(again.parameters(), shards[step], strict=True))
        moments = [local_part(s["exp_avg"]).sum().item()
                   for s in again_optimizer.state.values()]
        results.put((rank, step, same, len(moments)))
    finally:
        dist.destroy_process_group()


def test_fsdp2_shards_come_back_into_their_dtensors(tmp_path: Path) -> None:
    """replicated=False: each rank keeps its own shards; a restore copies them back into
    the DTensors of a new model and optimizer sharded alike."""
    got = run_ranks(_fsdp_rank, [(str(tmp_path / "store"), str(tmp_path / "host"))] * 2)
    (_, step0, same0, moments0), (_, step1, same1, moments1) = got
    assert step0 == step1 and step0 >= 1
    assert same0 and same1
    assert moments0 == moments1 == 4  # Adam's state of every parameter, back as DTensors
