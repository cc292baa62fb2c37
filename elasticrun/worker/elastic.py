"""Elastic training state and the failures it tells apart, independent of the tensor
framework.

A `State` is committed in memory (`commit()`); when a collective fails, every survivor
restores its last commit, joins the next round and syncs from the new rank 0. When
hosts change, all ranks agree at the same commit to interrupt, keep their state, join
the next round and sync. The framework side supplies a `Backend` for the collectives.
The loop that does this around the user's function is elastic_loop.py's `run_with`.
"""

from __future__ import annotations

import copy
import os
import queue
from collections.abc import Callable
from typing import Any, Protocol

from elasticrun import protocol
from elasticrun.protocol import HostUpdateResult, Notice
from elasticrun.worker import timeline

FAILURE_TEXT_LIMIT = 400  # room for a path or two (the driver keeps 500)


class HostsUpdatedInterrupt(RuntimeError):
    """Raised at a commit on every rank at once when the job's hosts changed."""

    def __init__(self) -> None:
        super().__init__("hosts changed; moving to a new round")


class WorkersFailedError(RuntimeError):
    """A collective failed because a peer died, hung or became unreachable."""


class UnrecoverableStateError(RuntimeError):
    """The committed state cannot be restored (none is left, or the one kept does not fit the
    model): a restart would fail the same way, so the job ends at once."""


class SnapshotMissingError(UnrecoverableStateError):
    """Every worker holding the committed state was lost and this round, started to go on
    from a kept commit, finds none (or its state keeps none): it does not train from
    scratch in silence."""


class CollectiveMismatchError(RuntimeError):
    """The ranks disagreed on a collective (its kind, dtype, shape, root...), or one could
    not run it: raised on every rank before any data moved, so the next collective works.
    A program error, not a failure: the elastic loop does not roll back for it."""


def describe_failure(exc: BaseException) -> str:
    """`"TypeName: first line of the message"`, at most FAILURE_TEXT_LIMIT characters."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text[:FAILURE_TEXT_LIMIT]


class Backend(Protocol):
    """What the elastic loop needs from the framework and the driver."""

    # What the user's own collectives raise when a peer fails (and other things too): such
    # an error is a peer failure only if the driver says the round broke.
    communication_errors: tuple[type[BaseException], ...]

    def broadcast_object(self, obj: Any, root_rank: int = 0) -> Any: ...

    def start_agreement(self, flag: bool) -> Callable[[], bool]:
        """Starts one scalar collective; the returned function waits for it and says
        whether `flag` was True on any rank (the same answer on every rank)."""
        ...

    # Optional (a backend without it always starts an agreement):
    # carried_agreement() -> Callable[[], bool] | None, the answer of a vote that every
    # rank's last step already carried (consumed by the call), or None when there is none.
    # It must return one on every rank at the same commits (collectives/host_vote.py).

    def hosts_changed(self) -> bool:
        """Whether this process knows of a host change the current round does not reflect."""
        ...

    def pending_notices(self) -> list[Notice]:
        """The host-change notices behind hosts_changed() that this process received."""
        ...

    def reset(self, failure: str, committed: bool) -> None:
        """Leaves the current round and joins the next one. `failure` says why ("" for a
        host change); `committed` whether a commit completed in the round being left."""
        ...

    def synced(self) -> None:
        """This worker now holds the round's committed state (tells the driver)."""
        ...

    def trained(self) -> None:
        """This worker completed its first commit (tells the driver: its slot works, and
        the failures of the slot's earlier workers are forgiven). Never raises."""
        ...

    def round_broken(self, within: float) -> bool:
        """Whether the driver says this worker's round broke (waits at most `within` s)."""
        ...

    def failing(self, failure: str, unrecoverable: bool = False) -> None:
        """This worker's own error ends it (tells the driver, so that its round breaks now
        rather than once this process is through its teardown; `unrecoverable`: the job
        cannot go on, an UnrecoverableStateError). Never raises."""
        ...


_default_backend: Backend | None = None


def set_default_backend(backend: Backend) -> None:
    """The framework module (e.g. elasticrun.torch.elastic) registers itself here."""
    global _default_backend
    _default_backend = backend


class State:
    """Base of everything `run` can roll back. Subclasses define save/restore/sync."""

    def __init__(self, backend: Backend | None = None) -> None:
        backend = backend or _default_backend
        if backend is None:
            raise RuntimeError("no elastic backend: import elasticrun.torch first")
        self._backend = backend
        self._reset_callbacks: list[Callable[[], None]] = []
        self._commits = 0
        # Horovod's State keeps this; scripts reset it to 0 before waiting for a notice.
        self._last_updated_timestamp = 0

    @property
    def _host_messages(self) -> queue.Queue[tuple[int, HostUpdateResult]]:
        """Horovod's queue of host-change notices, `(timestamp, update)`, that scripts read
        (`while state._host_messages.empty(): sleep`): here a fresh queue at each access,
        holding the driver's notices that the next commit will act on. They are the same
        notices that make commit() raise HostsUpdatedInterrupt, so a script that sees one
        and commits is interrupted, as with Horovod."""
        messages: queue.Queue[tuple[int, HostUpdateResult]] = queue.Queue()
        for notice in self._backend.pending_notices():
            messages.put((notice.timestamp, notice.update))
        return messages

    @_host_messages.setter
    def _host_messages(self, _: object) -> None:
        """Horovod's State.on_reset empties the queue by assigning a new one; code that does
        the same keeps working. Nothing to store: the queue always shows the notices still
        pending, and a reset leaves none."""

    @property
    def commit_count(self) -> int:
        """How many commits completed in this process (the loop tells rounds apart by it)."""
        return self._commits

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Functions called after every reset (e.g. to rescale the learning rate)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Called after every reset, before the state is synced: runs the callbacks given to
        register_reset_callbacks()."""
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Saves the state in memory and checks whether hosts changed (may raise
        HostsUpdatedInterrupt on every rank at once). The check is the vote the last
        optimizer step carried when there is one, else one scalar collective that runs
        while the state is copied."""
        with timeline.span("commit", "elastic", commit=self._commits + 1):
            flag = self._notice_pending()
            carried = getattr(self._backend, "carried_agreement", None)
            agreement = (carried() if carried is not None else None) or \
                self._backend.start_agreement(flag)
            self.save()
            interrupt = agreement()
            self._commits += 1
        if self._commits == 1:
            self._backend.trained()
        if interrupt:
            raise HostsUpdatedInterrupt()

    def check_host_updates(self) -> None:
        """Raises HostsUpdatedInterrupt on every rank at once when the hosts changed
        (one scalar collective), without saving the state."""
        if self._backend.start_agreement(self._notice_pending())():
            raise HostsUpdatedInterrupt()

    def _notice_pending(self) -> bool:
        pending = self._backend.hosts_changed()
        if pending:
            stamps = [notice.timestamp for notice in self._backend.pending_notices()]
            self._last_updated_timestamp = max([self._last_updated_timestamp, *stamps])
        return pending

    def save(self) -> None:
        """Keeps a copy of the state in memory (commit() calls it); subclasses define it."""
        raise NotImplementedError

    def restore(self) -> None:
        """Puts back the last saved copy (after a failure, before the next round)."""
        raise NotImplementedError

    def sync(self) -> None:
        """Makes every rank's state rank 0's (at the start of every round)."""
        raise NotImplementedError


class ObjectState(State):
    """Plain Python attributes, committed by deep copy and synced from rank 0."""

    def __init__(self, backend: Backend | None = None, **values: Any) -> None:
        super().__init__(backend)
        self._names = list(values)
        for name, value in values.items():
            setattr(self, name, value)
        self._saved: dict[str, Any] = {}
        self._synced = False
        self.save()

    def save(self) -> None:
        """Deep-copies the attributes."""
        self._saved = {name: copy.deepcopy(getattr(self, name)) for name in self._names}

    def restore(self) -> None:
        """Puts back the attributes' last saved copies."""
        for name, value in copy.deepcopy(self._saved).items():
            setattr(self, name, value)

    def sync(self) -> None:
        """Sets every rank's attributes to rank 0's, then saves them."""
        values, held = self._backend.broadcast_object(
            ({name: getattr(self, name) for name in self._names}, self._synced), 0)
        # Rank 0 holds the committed state whenever a member does. A worker started to replace
        # workers that were all lost finds none: it must not go on from scratch.
        if not held and os.environ.get(protocol.ENV_RESTORE) == "1":
            raise SnapshotMissingError(
                "every worker holding the committed state was lost, and an ObjectState keeps "
                "no snapshot of its commits (a TorchState does): this round cannot go on from "
                "the last commit")
        self._synced = True
        for name, value in values.items():
            setattr(self, name, value)
        self.save()
