"""The messages driver and workers exchange: a round's place (SlotInfo, JoinReply), host-change
notices, and the store keys of a round."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class HostUpdateResult(enum.IntFlag):
    """What a host-change notice announces; Horovod's names and values
    (horovod/runner/elastic/worker.py), so that scripts comparing them keep working."""

    no_update = 0
    removed = 1
    added = 2
    mixed = removed | added


@dataclass(frozen=True)
class Notice:
    """A host-change notice: its sequence number, when the driver posted it (whole seconds
    since the epoch, as Horovod stamps its notifications) and what changed."""

    seq: int
    timestamp: int
    update: HostUpdateResult

    def to_json(self) -> list[int]:
        return [self.seq, self.timestamp, int(self.update)]

    @classmethod
    def from_json(cls, data: Any) -> Notice:
        seq, timestamp, update = data
        return cls(int(seq), int(timestamp), HostUpdateResult(int(update)))


# Store keys of round N live under this prefix, so nothing leaks between rounds.
def round_prefix(round_number: int) -> str:
    return f"elasticrun/round{round_number}/"


def round_of_key(key: str) -> int | None:
    """The round a store key belongs to (it starts with round_prefix(n)), if any."""
    head, sep, _ = key.partition("/round")
    if head != "elasticrun" or not sep:
        return None
    number, slash, _ = key[len("elasticrun/round"):].partition("/")
    return int(number) if slash and number.isdigit() and len(number) < 10 else None


@dataclass(frozen=True)
class SlotInfo:
    """Where one worker stands in one round."""

    hostname: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int

    def to_json(self) -> dict[str, Any]:
        # Built directly: dataclasses.asdict (recursive, deep-copying) costs ~25x more, once
        # per join (tests/unit/test_protocol.py checks the two agree).
        return {"hostname": self.hostname, "rank": self.rank, "size": self.size,
                "local_rank": self.local_rank, "local_size": self.local_size,
                "cross_rank": self.cross_rank, "cross_size": self.cross_size}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SlotInfo:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class JoinReply:
    """The driver's answer to a worker asking for its place in the next round.

    `action` is "run" (slot holds this round's place), "exit" (this worker has no
    place any more and should end cleanly) or "retry" (the long-poll expired; ask again).
    """

    action: str
    round: int = 0
    slot: SlotInfo | None = None
    notice_seq: int = 0
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "round": self.round,
            "slot": self.slot.to_json() if self.slot else None,
            "notice_seq": self.notice_seq,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JoinReply:
        slot = data.get("slot")
        return cls(
            action=str(data["action"]),
            round=int(data.get("round", 0)),
            slot=SlotInfo.from_json(slot) if slot else None,
            notice_seq=int(data.get("notice_seq", 0)),
            reason=str(data.get("reason", "")),
        )
