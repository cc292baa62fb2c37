"""Elastic training state and the `run` loop, independent of the tensor framework.

A `State` is committed in memory (`commit()`); when a collective fails, every survivor
restores its last commit, joins the next round and syncs from the new rank 0. When
hosts change, all ranks agree at the same commit to interrupt, keep their state, join
the next round and sync. The framework side supplies a `Backend` for the collectives.
"""

from __future__ import annotations

import copy
import functools
import logging
import traceback
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

log = logging.getLogger("elasticrun.elastic")

R = TypeVar("R")


class HostsUpdatedInterrupt(RuntimeError):
    """Raised at a commit on every rank at once when the job's hosts changed."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts changed; moving to a new round")
        self.skip_sync = skip_sync


class WorkersFailedError(RuntimeError):
    """A collective failed because a peer died, hung or became unreachable."""


class Backend(Protocol):
    """What the elastic loop needs from the framework and the driver."""

    def rank(self) -> int: ...

    def broadcast_object(self, obj: Any, root_rank: int = 0) -> Any: ...

    def start_agreement(self, flag: bool) -> Callable[[], bool]:
        """Starts one scalar collective; the returned function waits for it and says
        whether `flag` was True on any rank (the same answer on every rank)."""
        ...

    def hosts_changed(self) -> bool:
        """Whether this process knows of a host change the current round does not reflect."""
        ...

    def reset(self) -> None:
        """Leaves the current round and joins the next one."""
        ...

    def synced(self) -> None:
        """This worker now holds the round's committed state (tells the driver)."""
        ...

    def as_failure(self, exc: BaseException) -> WorkersFailedError | None:
        """`exc` as a WorkersFailedError when it means a peer failed, else None."""
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

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Functions called after every reset (e.g. to rescale the learning rate)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Saves the state in memory and checks whether hosts changed (may raise
        HostsUpdatedInterrupt on every rank at once). The check's one scalar collective
        runs while the state is copied."""
        agreement = self._backend.start_agreement(self._backend.hosts_changed())
        self.save()
        if agreement():
            raise HostsUpdatedInterrupt()

    def check_host_updates(self) -> None:
        if self._backend.start_agreement(self._backend.hosts_changed())():
            raise HostsUpdatedInterrupt()

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


class ObjectState(State):
    """Plain Python attributes, committed by deep copy and synced from rank 0."""

    def __init__(self, backend: Backend | None = None, **values: Any) -> None:
        super().__init__(backend)
        self._names = list(values)
        for name, value in values.items():
            setattr(self, name, value)
        self._saved: dict[str, Any] = {}
        self.save()

    def save(self) -> None:
        self._saved = {name: copy.deepcopy(getattr(self, name)) for name in self._names}

    def restore(self) -> None:
        for name, value in copy.deepcopy(self._saved).items():
            setattr(self, name, value)

    def sync(self) -> None:
        values = self._backend.broadcast_object(
            {name: getattr(self, name) for name in self._names}, 0)
        for name, value in values.items():
            setattr(self, name, value)
        self.save()


def run_with(backend: Backend, func: Callable[..., R]) -> Callable[..., R]:
    """Wraps `func(state, ...)` so that it survives failures and host changes."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> R:
        needs_reset = False
        while True:
            try:
                if needs_reset:
                    backend.reset()
                    state.on_reset()
                    needs_reset = False
                state.sync()
                backend.synced()
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt:
                log.info("hosts changed; keeping the current state and moving to a new round")
            except Exception as exc:
                failure = exc if isinstance(exc, WorkersFailedError) else backend.as_failure(exc)
                if failure is None:
                    raise
                # Release what the failed frames hold (async works keep the old round's
                # sockets open, and peers blocked on them would wait for a timeout).
                traceback.clear_frames(exc.__traceback__)
                log.warning("a collective failed (%s); restoring the last commit",
                            _first_line(failure))
                state.restore()
            needs_reset = True

    return wrapper


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
