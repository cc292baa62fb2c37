"""The boundary of every collective elasticrun issues: a communication failure becomes a type.

Gloo reports a peer that died, hung or was cut off as a RuntimeError (torch's DistError
family, or a plain RuntimeError: torch 2.13's Gloo raises the latter). Inside
`collective(...)`, such an error becomes `WorkersFailedError`, chained to the original.
Misuse (ValueError, TypeError) and elasticrun's own typed errors pass unchanged.
"""

from __future__ import annotations

from types import TracebackType

from elasticrun.worker.client import RequestRefusedError
from elasticrun.worker.elastic import HostsUpdatedInterrupt, WorkersFailedError

# RuntimeErrors that are not a failed communication.
_NOT_COMMUNICATION = (WorkersFailedError, HostsUpdatedInterrupt, RequestRefusedError,
                      NotImplementedError, RecursionError)


class collective:  # noqa: N801 - used like a function: `with collective("allreduce"):`
    """`with collective("allreduce"): dist.all_reduce(...)` raises WorkersFailedError when
    the call fails to communicate."""

    __slots__ = ("_what",)

    def __init__(self, what: str) -> None:
        self._what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if isinstance(exc, RuntimeError) and not isinstance(exc, _NOT_COMMUNICATION):
            lines = str(exc).strip().splitlines()
            detail = lines[0] if lines else type(exc).__name__
            raise WorkersFailedError(f"{self._what} failed: {detail}") from exc
