"""Worker failures: the first one is the job's root cause; each one is reported."""

from __future__ import annotations

from collections.abc import Iterable

from elasticrun.driver.operate.telemetry import Telemetry


class FailureLog:
    def __init__(self, telemetry: Telemetry) -> None:
        self._telemetry = telemetry
        self.first: str | None = None

    def worker_failed(self, cause: str, *, host: str, kind: str, rank: int | None = None,
                      exit_code: int | None = None, stderr_tail: Iterable[str] = ()) -> None:
        """`kind` (the metric label): signal | exit_code | exception | spawn_error |
        check_in_timeout."""
        tail = list(stderr_tail)
        if self.first is None:
            lines = "\n".join(f"    {line}" for line in tail)
            self.first = cause + (f"; last lines of its stderr:\n{lines}" if tail else "")
        self._telemetry.worker_failed(rank=rank, host=host, exit_code=exit_code, cause=cause,
                                      cause_label=kind, stderr_tail=tail)

    def suffix(self) -> str:
        """`; first failure: ...` for the job's final error message, or nothing."""
        return f"; first failure: {self.first}" if self.first else ""
