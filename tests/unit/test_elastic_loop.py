"""The elastic loop (`run_with`) decides from exception types and the driver's word on the
round, never from message text. Driven here through a fake backend: tables of what the
training function raises -> what the loop does (restore, reset with why, sync, re-raise)."""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch.distributed as dist

from elasticrun.protocol import HostUpdateResult, Notice
from elasticrun.torch.elastic import TorchBackend
from elasticrun.worker.client import DriverUnreachableError
from elasticrun.worker.elastic import (
    FAILURE_TEXT_LIMIT,
    Backend,
    HostsUpdatedInterrupt,
    ObjectState,
    WorkersFailedError,
    describe_failure,
)
from elasticrun.worker.elastic_loop import BROKEN_ROUND_WAIT_S, run_with

USER_TIMEOUT = RuntimeError("connection timed out while reading shard 17 from the data lake")


class FakeDistError(RuntimeError):
    """What a user's own raw collective raises when it fails (torch's DistError)."""


@dataclass
class FakeBackend:
    """Collectives of a world of one; records what the loop asks of the framework."""

    communication_errors: tuple[type[BaseException], ...] = (FakeDistError,)
    broken: bool = False  # the driver's answer to "did my round break?"
    changed: list[bool] = field(default_factory=list)  # hosts_changed() answers, in turn
    notices: list[Notice] = field(default_factory=list)  # what pending_notices() returns
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def broadcast_object(self, obj: Any, root_rank: int = 0) -> Any:
        self.calls.append(("sync",))
        return obj

    def start_agreement(self, flag: bool) -> Any:
        return lambda: flag

    def hosts_changed(self) -> bool:
        return self.changed.pop(0) if self.changed else False

    def pending_notices(self) -> list[Notice]:
        return list(self.notices)

    def reset(self, failure: str, committed: bool) -> None:
        self.calls.append(("reset", failure, committed))
        self.notices.clear()  # the new round reflects them

    def synced(self) -> None:
        self.calls.append(("synced",))

    def trained(self) -> None:
        self.calls.append(("trained",))

    def round_broken(self, within: float) -> bool:
        self.calls.append(("round_broken", within))
        return self.broken

    def failing(self, failure: str, unrecoverable: bool = False) -> None:
        self.calls.append(("failing", failure) + (("unrecoverable",) if unrecoverable else ()))

    def named(self, name: str) -> list[tuple[Any, ...]]:
        return [call[1:] for call in self.calls if call[0] == name]


class Counter(ObjectState):
    step: int

    def __init__(self, backend: Backend) -> None:
        super().__init__(backend, step=0)
        self.restores = 0

    def restore(self) -> None:
        self.restores += 1
        super().restore()


def trainer(script: list[list[Any]]) -> Any:
    """A training function: each run (one per round) plays the next list of actions:
    "step" (step += 1, then commit), "bump" (step += 1, no commit) or an exception."""

    def train(state: Counter) -> int:
        for action in script.pop(0):
            if isinstance(action, BaseException):
                raise action
            state.step += 1
            if action == "step":
                state.commit()
        return state.step

    return train


def test_a_run_without_trouble_syncs_once_and_never_resets() -> None:
    """...and says once, at its first commit, that this worker has trained."""
    backend = FakeBackend()
    state = Counter(backend)
    assert run_with(backend, trainer([["step", "step"]]))(state) == 2
    assert backend.calls == [("sync",), ("synced",), ("trained",)]
    assert state.restores == 0 and state.commit_count == 2


FAILED = WorkersFailedError("allreduce failed: Connection reset by peer")


@pytest.mark.parametrize(
    ("script", "changed", "broken", "step", "restores", "resets", "asked"), [
        # A host change: every rank interrupts at the same commit, keeps its state.
        ([["step", "step"], ["step"]], [False, True], False, 3, 0, [("", True)], 0),
        # A peer failed after a commit: back to it, and the driver hears why.
        ([["step", "bump", FAILED], ["step"]], [], False, 2, 1,
         [("WorkersFailedError: allreduce failed: Connection reset by peer", True)], 0),
        # A peer failed before any commit of the round: nothing committed in it.
        ([["bump", FAILED], ["step"]], [], False, 1, 1,
         [("WorkersFailedError: allreduce failed: Connection reset by peer", False)], 0),
        # The user's own collective failed and the driver says the round broke.
        ([["step", FakeDistError("Connection closed by peer")], []], [], True, 1, 1,
         [("FakeDistError: Connection closed by peer", True)], 1),
        # Two failures in a row: each round left reports its own commits.
        ([["step", FAILED], [FAILED], ["step"]], [], False, 2, 2,
         [("WorkersFailedError: allreduce failed: Connection reset by peer", True),
          ("WorkersFailedError: allreduce failed: Connection reset by peer", False)], 0),
    ])
def test_the_loop_recovers_from_what_the_round_did(
        script: list[list[Any]], changed: list[bool], broken: bool, step: int,
        restores: int, resets: list[tuple[str, bool]], asked: int) -> None:
    backend = FakeBackend(changed=changed, broken=broken)
    state = Counter(backend)
    callbacks: list[int] = []
    state.register_reset_callbacks([lambda: callbacks.append(len(backend.named("reset")))])
    assert run_with(backend, trainer(script))(state) == step
    assert state.restores == restores
    assert backend.named("reset") == resets
    assert backend.named("round_broken") == [(BROKEN_ROUND_WAIT_S,)] * asked
    # After every reset: the callbacks, then a sync from rank 0, then the driver hears of it.
    assert callbacks == list(range(1, len(resets) + 1))
    assert backend.named("sync") == [()] * (len(resets) + 1)
    assert [c[0] for c in backend.calls if c[0] not in ("round_broken", "trained")] == \
        ["sync", "synced"] + ["reset", "sync", "synced"] * len(resets)
    assert backend.named("trained") == [()]  # once, at this process's first commit


@pytest.mark.parametrize(("raised", "communication_errors", "broken", "asked"), [
    (ValueError("injected fault at step 3"), (FakeDistError,), True, False),
    (USER_TIMEOUT, (FakeDistError,), True, False),  # the text says nothing: its type does
    (FakeDistError("Connection closed by peer"), (FakeDistError,), False, True),
    (DriverUnreachableError("driver unreachable for 30s"), (FakeDistError, OSError), True,
     False),
    # With torch's own list, a user's RuntimeError is only re-raised once the driver says
    # the round is fine (torch 2.13's Gloo reports peer failures as plain RuntimeError).
    (USER_TIMEOUT, TorchBackend.communication_errors, False, True),
    (dist.DistNetworkError("Connection reset by peer"), TorchBackend.communication_errors,
     False, True),
])
def test_an_error_that_is_not_a_peer_failure_ends_the_worker(
        raised: Exception, communication_errors: tuple[type[BaseException], ...],
        broken: bool, asked: bool) -> None:
    backend = FakeBackend(communication_errors=communication_errors, broken=broken)
    state = Counter(backend)
    with pytest.raises(type(raised)) as info:
        run_with(backend, trainer([["step", raised]]))(state)
    assert info.value is raised
    assert backend.named("round_broken") == ([(BROKEN_ROUND_WAIT_S,)] if asked else [])
    assert backend.named("reset") == [] and state.restores == 0
    assert state.step == 1  # left as it was: nothing rolled back
    # The driver hears of the worker's own error before it exits (unless it is unreachable).
    unreachable = isinstance(raised, DriverUnreachableError)
    assert backend.named("failing") == ([] if unreachable else [(describe_failure(raised),)])


def test_the_torch_backend_takes_a_dist_error_to_the_driver() -> None:
    assert issubclass(dist.DistError, TorchBackend.communication_errors)
    backend = FakeBackend(communication_errors=TorchBackend.communication_errors, broken=True)
    state = Counter(backend)
    run_with(backend, trainer([["step", dist.DistBackendError("NCCL error")], ["step"]]))(state)
    assert backend.named("reset") == [("DistBackendError: NCCL error", True)]


def test_a_failure_during_the_sync_after_a_reset_asks_for_yet_another_round() -> None:
    backend = FakeBackend()
    state = Counter(backend)
    syncs = 0
    plain_sync = state.sync

    def flaky_sync() -> None:
        nonlocal syncs
        syncs += 1
        if syncs == 2:
            raise WorkersFailedError("broadcast_object failed: Connection closed by peer")
        plain_sync()

    state.sync = flaky_sync  # type: ignore[method-assign]
    run_with(backend, trainer([["step", FAILED], ["step"]]))(state)
    assert backend.named("reset") == [
        ("WorkersFailedError: allreduce failed: Connection reset by peer", True),
        ("WorkersFailedError: broadcast_object failed: Connection closed by peer", False)]


def test_a_failure_is_described_by_its_type_and_first_line() -> None:
    assert describe_failure(RuntimeError("first\nsecond")) == "RuntimeError: first"
    assert describe_failure(WorkersFailedError()) == "WorkersFailedError"
    long = describe_failure(WorkersFailedError("x" * 500))
    assert len(long) == FAILURE_TEXT_LIMIT and long.startswith("WorkersFailedError: xx")


def test_hosts_updated_interrupt_needs_no_arguments() -> None:
    interrupt = HostsUpdatedInterrupt()
    assert isinstance(interrupt, RuntimeError) and not hasattr(interrupt, "skip_sync")


def test_horovods_host_messages_show_the_notices_the_next_commit_acts_on() -> None:
    """Horovod scripts wait for a host change with `state._host_messages` and reset
    `state._last_updated_timestamp`; both behave as on Horovod's State, backed by the
    driver's notices: a script that sees a message and commits is interrupted."""
    notice = Notice(7, 1_700_000_123, HostUpdateResult.removed)
    backend = FakeBackend(changed=[False, True])
    state = Counter(backend)
    assert state._host_messages.empty() and state._last_updated_timestamp == 0
    state.commit()  # nothing pending: no interrupt
    backend.notices.append(notice)
    state._last_updated_timestamp = 0  # what Horovod's test script does before waiting
    messages = state._host_messages
    assert not messages.empty()
    assert messages.get_nowait() == (1_700_000_123, HostUpdateResult.removed)
    assert not state._host_messages.empty()  # reading it does not consume the notice
    with pytest.raises(HostsUpdatedInterrupt):
        state.commit()
    assert state._last_updated_timestamp == 1_700_000_123
    backend.reset("", True)
    assert state._host_messages.empty()  # the next round reflects the notice
    state._host_messages = queue.Queue()  # as Horovod's on_reset does: accepted
    assert state._host_messages.empty()
