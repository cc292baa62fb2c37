"""Worker failures: the first one is the job's root cause; each one is reported."""

from __future__ import annotations

from collections.abc import Iterable

from elasticrun.driver.operate.telemetry import Telemetry
from elasticrun.system.printable import printable


class FailureLog:
    def __init__(self, telemetry: Telemetry) -> None:
        self._telemetry = telemetry
        self.first: str | None = None  # the first failure's cause
        self._first_tail: list[str] = []

    def worker_failed(self, cause: str, *, host: str, kind: str, rank: int | None = None,
                      exit_code: int | None = None, stderr_tail: Iterable[str] = ()) -> None:
        """`kind` (the metric label): signal | exit_code | exception | spawn_error |
        check_in_timeout | hang | lost."""
        tail = list(stderr_tail)
        if self.first is None:
            self.first, self._first_tail = cause, tail
        self._telemetry.worker_failed(rank=rank, host=host, exit_code=exit_code, cause=cause,
                                      cause_label=kind, stderr_tail=tail)

    def suffix(self, message: str = "") -> str:
        """What the job's final error `message` adds: the first failure (unless the message
        names it already) and the last lines of its stderr, their control characters
        escaped (a worker's output does not drive the operator's terminal)."""
        if self.first is None:
            return ""
        lines = "\n".join(f"    {printable(line)}" for line in self._first_tail)
        tail = f"; last lines of its stderr:\n{lines}" if self._first_tail else ""
        if self.first in message:
            return tail
        return f"; first failure: {printable(self.first)}{tail}"
