"""Stand-ins for the side a test is not about (the behaviour under test is never faked)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RecordingListener:
    """Stands in for the driver: records what the rendezvous server tells it."""

    calls: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)

    def barrier_started(self, round_number: int) -> None:
        self.calls.append(("barrier_started", (round_number,)))

    def reset_requested(self, worker_id: str, last_round: int) -> None:
        self.calls.append(("reset_requested", (worker_id, last_round)))

    def worker_released(self, worker_id: str) -> None:
        self.calls.append(("worker_released", (worker_id,)))

    def worker_joined(self, worker_id: str, round_number: int, rank: int) -> None:
        self.calls.append(("worker_joined", (worker_id, round_number, rank)))

    def standby_ready(self, worker_id: str) -> None:
        self.calls.append(("standby_ready", (worker_id,)))

    def round_completed(self, round_number: int) -> None:
        self.calls.append(("round_completed", (round_number,)))

    def worker_synced(self, worker_id: str, round_number: int) -> None:
        self.calls.append(("worker_synced", (worker_id, round_number)))

    def named(self, name: str) -> list[tuple[Any, ...]]:
        return [args for called, args in self.calls if called == name]
