"""The boundary of every collective elasticrun issues: a communication failure becomes a type.

Gloo reports a peer that died, hung or was cut off as a RuntimeError (torch's DistError
family, or a plain RuntimeError: torch 2.13's Gloo raises the latter). Inside
`collective(...)`, such an error becomes `WorkersFailedError`, chained to the original.
Misuse (ValueError, TypeError) and elasticrun's own typed errors pass unchanged.
With the timeline on, each block is also one "collective" event (its bytes and op).
"""

from __future__ import annotations

import time
from types import TracebackType

from elasticrun.worker import timeline
from elasticrun.worker.client import RequestRefusedError
from elasticrun.worker.elastic import (
    CollectiveMismatchError,
    HostsUpdatedInterrupt,
    WorkersFailedError,
)

# RuntimeErrors that are not a failed communication.
_NOT_COMMUNICATION = (WorkersFailedError, HostsUpdatedInterrupt, RequestRefusedError,
                      CollectiveMismatchError,
                      NotImplementedError, RecursionError)


class collective:  # noqa: N801 - used like a function: `with collective("allreduce"):`
    """`with collective("allreduce", nbytes=n, op="sum"): dist.all_reduce(...)` raises
    WorkersFailedError when the call fails to communicate. `nbytes` and `op` only describe
    the collective for the timeline."""

    __slots__ = ("_what", "_nbytes", "_op", "_start")

    def __init__(self, what: str, *, nbytes: int = 0, op: str = "") -> None:
        self._what = what
        self._nbytes = nbytes
        self._op = op
        self._start = 0.0

    def __enter__(self) -> None:
        if timeline.enabled():
            self._start = time.time()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._start:
            if kind is None:
                timeline.record(self._what, "collective", self._start, time.time(),
                                bytes=self._nbytes, op=self._op)
            else:
                timeline.record(self._what, "collective", self._start, time.time(),
                                bytes=self._nbytes, op=self._op, error=kind.__name__)
        if isinstance(exc, RuntimeError) and not isinstance(exc, _NOT_COMMUNICATION):
            lines = str(exc).strip().splitlines()
            detail = lines[0] if lines else type(exc).__name__
            raise WorkersFailedError(f"{self._what} failed: {detail}") from exc
