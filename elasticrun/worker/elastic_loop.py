"""The elastic `run` loop around the user's function, independent of the tensor framework.

Each pass syncs the state and calls the function; when it raises, the loop decides from
exception types and the driver's word, never from message text: `HostsUpdatedInterrupt`
keeps the state, `WorkersFailedError` (raised by elasticrun's own collectives) rolls back,
an error of the kind the user's own collectives raise (`Backend.communication_errors`)
rolls back only when the driver says the round broke, and anything else is the user's: it
ends this worker, with its traceback. After either kind of interruption, this worker leaves
the round and joins the next one (`Backend.reset`).
"""

from __future__ import annotations

import functools
import logging
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from elasticrun.worker import timeline
from elasticrun.worker.client import DriverUnreachableError
from elasticrun.worker.elastic import (
    Backend,
    HostsUpdatedInterrupt,
    State,
    UnrecoverableStateError,
    WorkersFailedError,
    describe_failure,
)

log = logging.getLogger("elasticrun.elastic")

R = TypeVar("R")

# How long a worker whose own collective failed waits for the driver to say whether its
# round broke, before it takes the error for its own and dies with it.
BROKEN_ROUND_WAIT_S = 3.0


def is_round_failure(backend: Backend, exc: Exception) -> bool:
    """Whether `exc` means the round failed (so this worker rolls back and goes on) rather
    than this worker's own code (so it dies with the error). Decided by type, and for an
    error the user's own collectives may raise, by the driver's word on the round."""
    if isinstance(exc, WorkersFailedError):
        return True
    if isinstance(exc, (DriverUnreachableError, HostsUpdatedInterrupt)):
        return False
    if isinstance(exc, backend.communication_errors):
        broken = backend.round_broken(BROKEN_ROUND_WAIT_S)
        log.info("%s; the driver says the round %s", describe_failure(exc),
                 "broke" if broken else "is fine, so the error is this worker's own")
        return broken
    return False


def run_with(backend: Backend, func: Callable[..., R]) -> Callable[..., R]:
    """Wraps `func(state, ...)` so that it survives failures and host changes."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> R:
        leaving: tuple[str, bool] | None = None  # (failure, committed) of the round left
        while True:
            commits_before = state.commit_count
            try:
                if leaving is not None:
                    with timeline.span("reset", "elastic", failure=leaving[0]):
                        backend.reset(*leaving)
                    leaving = None
                    state.on_reset()
                with timeline.span("sync", "elastic"):
                    state.sync()
                backend.synced()
                commits_before = state.commit_count
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt:
                timeline.instant("HostsUpdatedInterrupt", "elastic")
                log.info("hosts changed; keeping the current state and moving to a new round")
                failure = ""
            except Exception as exc:
                if not is_round_failure(backend, exc):
                    timeline.instant("error", "elastic", error=describe_failure(exc))
                    if not isinstance(exc, DriverUnreachableError):
                        backend.failing(describe_failure(exc),
                                        isinstance(exc, UnrecoverableStateError))
                    raise
                failure = describe_failure(exc)
                timeline.instant(type(exc).__name__, "elastic", failure=failure)
                # Release what the failed frames hold (async works keep the old round's
                # sockets open, and peers blocked on them would wait for a timeout).
                _clear_frames(exc)
                log.warning("a collective failed (%s); restoring the last commit", failure)
                with timeline.span("restore", "elastic"):
                    state.restore()
            leaving = (failure, state.commit_count > commits_before)

    return wrapper


def _clear_frames(exc: BaseException | None) -> None:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__
