"""A round's session and the runtime that strings rounds together (real torch.distributed,
one process; the driver is a recording stand-in).

Building a Gloo group that fails must not change how the next group's keys are named, a
failed build is a typed failure, and a worker that leaves a round tells the driver why."""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from elasticrun import protocol
from elasticrun.protocol import SlotInfo
from elasticrun.torch.collectives.fusion import fused_collective
from elasticrun.torch.world import groups, runtime
from elasticrun.torch.world.boundary import collective
from elasticrun.torch.world.session import RoundSession
from elasticrun.worker.client import DriverClient, RequestRefusedError
from elasticrun.worker.elastic import HostsUpdatedInterrupt, WorkersFailedError


def _slot(rank: int, size: int) -> SlotInfo:
    return SlotInfo("localhost", rank, size, rank, size, 0, 1)


@pytest.fixture(autouse=True)
def _no_group_left() -> Iterator[None]:
    yield
    groups.destroy_process_group()


def test_a_failed_group_build_leaves_the_group_counter_alone() -> None:
    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=0.5))
    before = runtime._group_count()
    assert before is not None, "torch no longer has the counter this guards"
    with pytest.raises(Exception):  # noqa: B017 - the peer (rank 1) never comes
        runtime._init_process_group(_slot(0, 2), dist.PrefixStore("a/", store), 0.5)
    assert runtime._group_count() == before
    assert not dist.is_initialized()
    # A group that does get built is named as if the failed attempt never happened.
    runtime._init_process_group(_slot(0, 1), dist.PrefixStore("b/", store), 0.5)
    try:
        assert runtime._group_count() == before + 1
    finally:
        groups.destroy_process_group()
    assert runtime._group_count() == 0


def test_a_traceback_carries_the_rank_once_however_many_rounds_built_a_group(
        capsys: pytest.CaptureFixture[str]) -> None:
    # torch wraps sys.excepthook at every default group it builds; a worker builds one per
    # round, and the rank prefix must be the current round's, once.
    hook = sys.excepthook
    for number in range(3):
        runtime._init_process_group(_slot(0, 1), dist.PrefixStore(f"r{number}/",
                                                                  dist.HashStore()), 0.5)
        groups.destroy_process_group()
    runtime._init_process_group(_slot(0, 1), dist.PrefixStore("last/", dist.HashStore()), 0.5)
    try:
        try:
            raise ValueError("boom")
        except ValueError as exc:
            sys.excepthook(type(exc), exc, exc.__traceback__)
    finally:
        groups.destroy_process_group()
    err = capsys.readouterr().err
    assert err.count("[rank0]: ValueError: boom") == 1 and "[rank0]: [rank0]" not in err
    assert sys.excepthook is hook  # put back with the group


def test_a_session_whose_peer_never_comes_fails_with_a_typed_error() -> None:
    store = dist.HashStore()
    before = runtime._group_count()
    session = RoundSession(3, _slot(0, 2), store, collective_timeout=0.5,
                           key_prefix=protocol.round_prefix(3))
    with pytest.raises(WorkersFailedError, match="building round 3's group failed") as info:
        session.build()
    assert isinstance(info.value.__cause__, RuntimeError)  # the store's timeout, chained
    assert runtime._group_count() == before and not dist.is_initialized()
    session.leave()  # nothing was built: leaving is still safe


class RecordingStore(dist.Store):
    """A HashStore that remembers which keys were set."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = dist.HashStore()
        self.keys: list[str] = []

    def set(self, key: str, value: Any) -> None:
        self.keys.append(key)
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def add(self, key: str, amount: int) -> int:
        self.keys.append(key)
        return self.inner.add(key, amount)

    def check(self, keys: list[str]) -> bool:
        return self.inner.check(keys)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        self.inner.wait(keys)

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self.inner.set_timeout(timeout)


def test_a_session_builds_under_its_round_prefix_and_leaves_nothing_behind() -> None:
    store = RecordingStore()
    session = RoundSession(2, _slot(0, 1), store, key_prefix=protocol.round_prefix(2))
    session.build()
    assert session.built and dist.is_initialized()
    assert dist.get_world_size() == 1
    assert store.keys and {protocol.round_of_key(key) for key in store.keys} == {2}
    session.leave()
    assert not dist.is_initialized() and runtime._group_count() == 0


def test_a_session_aborted_before_its_build_does_not_build() -> None:
    session = RoundSession(4, _slot(0, 1), dist.HashStore())
    assert session.abort() == 0  # nothing to cut yet
    with pytest.raises(WorkersFailedError, match="round 4 broke"):
        session.build()
    assert not dist.is_initialized()


@pytest.mark.parametrize(("raised", "expected"), [
    (RuntimeError("Connection reset by peer"), WorkersFailedError),
    (dist.DistNetworkError("connection closed"), WorkersFailedError),
    (dist.DistStoreError("round broke (410)"), WorkersFailedError),
    (ValueError("Default process group has not been initialized"), ValueError),
    (TypeError("bad tensor"), TypeError),
    (HostsUpdatedInterrupt(), HostsUpdatedInterrupt),
    (RequestRefusedError(403, "unknown worker"), RequestRefusedError),
])
def test_the_collective_boundary_types_communication_failures(
        raised: Exception, expected: type[Exception]) -> None:
    with pytest.raises(expected) as info:
        with collective("allreduce"):
            raise raised
    if expected is WorkersFailedError:
        assert info.value.__cause__ is raised
        assert str(info.value).startswith("allreduce failed: ")
    else:
        assert info.value is raised


class _FailingWork:
    def wait(self) -> None:
        raise RuntimeError("Timed out waiting 3000ms for recv operation to complete")


def test_a_fused_collective_types_failures_of_its_launch_and_of_its_wait() -> None:
    def failing_launch(flat: torch.Tensor) -> None:
        raise RuntimeError("Connection closed by peer")

    with pytest.raises(WorkersFailedError, match="broadcast_tree failed"):
        fused_collective([torch.ones(3)], failing_launch, what="broadcast_tree")
    def failing_wait(flat: torch.Tensor) -> Any:
        return _FailingWork()

    with pytest.raises(WorkersFailedError, match="Timed out"):
        fused_collective([torch.ones(3)], failing_wait)

    def misused(flat: torch.Tensor) -> None:
        raise ValueError("tensors must be contiguous")

    with pytest.raises(ValueError):
        fused_collective([torch.ones(3)], misused)


class FakeDriver(DriverClient):
    """Answers the join and notice requests as a test tells it; records every request."""

    def __init__(self, joins: list[dict[str, Any]], notices: list[dict[str, Any]]) -> None:
        super().__init__("127.0.0.1", 1, "secret", unreachable_timeout=1.0)
        self.joins, self.notices = joins, notices
        self.requests: list[tuple[str, dict[str, Any]]] = []

    def call(self, path: str, payload: dict[str, Any], wait: float = 0.0) -> dict[str, Any]:
        self.requests.append((path, dict(payload)))
        if path == protocol.PATH_JOIN:
            return self.joins.pop(0)
        if path == protocol.PATH_NOTICES:
            return self.notices.pop(0) if self.notices else {"seq": 0, "broken_round": 0}
        raise AssertionError(f"unexpected request to {path}")

    def sent(self, path: str) -> list[dict[str, Any]]:
        return [payload for called, payload in self.requests if called == path]


def _run(round_number: int) -> dict[str, Any]:
    return protocol.JoinReply("run", round=round_number, slot=_slot(0, 1)).to_json()


def test_a_worker_tells_the_driver_why_it_asks_for_a_new_round(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A join publishes this worker's place in the environment: put back after the test.
    monkeypatch.setattr(os, "environ", os.environ.copy())
    builds: list[int] = []

    def connect(slot: SlotInfo, store: dist.Store, timeout: float) -> None:
        builds.append(slot.rank)
        if len(builds) == 2:  # round 2's peer is lost while its group is built
            raise dist.DistStoreError("the round broke while its group was being built")

    monkeypatch.setattr(runtime, "_init_process_group", connect)
    driver = FakeDriver([_run(1), _run(2), {"action": "retry"}, _run(3)], [])
    rt = runtime.Runtime(driver, "w1", collective_timeout=1.0)
    rt._join(last_round=0, failure="", committed=False)
    assert rt.round == 1 and rt.slot.size == 1
    rt.reset("WorkersFailedError: allreduce failed: Connection reset by peer", True)
    assert rt.round == 3 and len(builds) == 3
    assert driver.sent(protocol.PATH_JOIN) == [
        {"worker_id": "w1", "last_round": 0, "failure": "", "committed": False},
        {"worker_id": "w1", "last_round": 1, "committed": True,
         "failure": "WorkersFailedError: allreduce failed: Connection reset by peer"},
        {"worker_id": "w1", "last_round": 2, "committed": False,
         "failure": "WorkersFailedError: building round 2's group failed: the round broke "
                    "while its group was being built"},
        {"worker_id": "w1", "last_round": 2, "committed": False,
         "failure": "WorkersFailedError: building round 2's group failed: the round broke "
                    "while its group was being built"},
    ]
    assert rt.last_join.asked <= rt.last_join.assigned <= rt.last_join.built


@pytest.mark.parametrize(("notices", "broken", "polls"), [
    ([{"seq": 0, "broken_round": 5}], True, 1),
    ([{"seq": 1, "broken_round": 0}, {"seq": 1, "broken_round": 5}], True, 2),  # a notice first
    ([{"seq": 0, "broken_round": 4}], False, None),  # an older round broke, not ours
])
def test_the_runtime_asks_the_driver_whether_its_round_broke(
        notices: list[dict[str, Any]], broken: bool, polls: int | None) -> None:
    driver = FakeDriver([], notices)
    rt = runtime.Runtime(driver, "w1")
    rt.session = RoundSession(5, _slot(0, 2), dist.HashStore())
    assert rt.round_broken(within=0.2) is broken
    sent = driver.sent(protocol.PATH_NOTICES)
    assert sent[0]["round"] == 5 and sent[0]["after"] == 0 and sent[0]["timeout"] <= 0.2
    if polls is not None:
        assert len(sent) == polls
    if polls == 2:
        assert sent[1]["after"] == 1  # a host-change notice does not end the wait


def test_without_a_driver_no_round_is_ever_broken() -> None:
    assert runtime.Runtime().round_broken(within=5.0) is False


def test_an_nccl_abort_unsettles_the_device_state_unless_the_work_was_drained() -> None:
    class NoCommunicator:  # aborting it fails, as for a group never connected
        pass

    groups.take_unsettled()
    try:
        groups.abort_nccl(NoCommunicator(), drained=True)  # type: ignore[arg-type]
        assert not groups.take_unsettled()  # a clean leave: the reductions completed
        groups.abort_nccl(NoCommunicator())  # type: ignore[arg-type]
        assert groups.take_unsettled()  # cut with work maybe in flight: compare at sync
        assert not groups.take_unsettled()  # once
    finally:
        groups.take_unsettled()
