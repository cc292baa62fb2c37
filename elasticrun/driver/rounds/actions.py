"""Pure: what the round machine asks for — actions, the timers it sets among them.

Actions go to the executor's parts (the process pool, the worker server, telemetry, the
job's result); a timer set here comes back as a TimerFired event (events.py). Plain frozen
data, so that a test can write "state, event -> actions" as a table.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from elasticrun.driver.rounds.assignment import Assignment, SlotId
from elasticrun.protocol import HostUpdateResult, JoinReply


class TimerKind(enum.Enum):
    START_DEADLINE = "start_deadline"  # --start-timeout: start with what there is, or fail
    CUT_ROUND = "cut_round"  # failures collected / an unexplained reset waited out
    CAPACITY_DEADLINE = "capacity_deadline"  # --elastic-timeout while short of --min-np
    SYNC_REPORTS_DUE = "sync_reports_due"  # sync reports in flight had their chance
    CHECK_IN = "check_in"  # a new member of `round` did not call er.init() in --init-timeout
    REJOIN = "rejoin"  # a running member of `round` has not rejoined within the rejoin bound
    UNJOINED = "unjoined"  # no member of `round` has joined since it opened (the backstop)
    HOLD_LEAVING = "hold_leaving"  # leaving workers of `round` stop waiting for it to settle
    STANDBY_DEADLINE = "standby_deadline"  # standby `worker` has not checked in
    COOLDOWN_END = "cooldown_end"  # blacklisted `host` (or its slot `slot`) may return
    VACATE = "vacate"  # failed `worker` still occupies the slot its refill waits for
    PROBE = "probe"  # a stalled `round`: who answered its probe, who is hung (liveness.py)
    FORMING = "forming"  # `round` not settled yet: what its laggards' hosts say (liveness.py)
    RESUME_BOUND = "resume_bound"  # a resumed driver stops waiting for workers to come back
    RESTART_STOPPED = "restart_stopped"  # a restarted round's members had their time to stop
    LAST_CALL = "last_call"  # torchrun's last call: the first round starts with what joined


@dataclass(frozen=True)
class Timer:
    kind: TimerKind
    round: int = 0
    worker: str = ""
    host: str = ""
    slot: int = -1  # a slot's index on `host` (-1: the host itself)


# --- actions ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Spawn:
    worker: str
    slot: SlotId
    assignment: Assignment  # the round it is for (its place, and the torchrun master)
    standby: bool
    round: int = 0  # the round it is started for (standbys: the one after the current)
    restarts: int = 0  # rounds restarted whole so far (TORCHELASTIC_RESTART_COUNT)
    restore: bool = False  # it replaces workers that were all lost: restore a kept commit


@dataclass(frozen=True)
class StopWorkers:
    workers: tuple[str, ...]
    kill: bool = False  # SIGKILL now, no grace period (a hung worker must not wake up)


@dataclass(frozen=True)
class OpenRound:
    number: int
    assignment: Assignment
    new_workers: int


@dataclass(frozen=True)
class BreakRound:
    """Members of `number` stop waiting on it: its store keys and notice polls answer now."""

    number: int


@dataclass(frozen=True)
class ProbeRound:
    """Members' notice polls of `round` answer now with probe number `probe`; each live
    member's watcher answers it at once (ProbeAnswered)."""

    round: int
    probe: int


@dataclass(frozen=True)
class InspectWorkers:
    """Ask the workers' hosts what their processes are doing (ProcessesInspected)."""

    round: int
    workers: tuple[str, ...]


@dataclass(frozen=True)
class PostNotice:
    seq: int
    update: HostUpdateResult  # what the next round adds or removes


@dataclass(frozen=True)
class AnswerJoin:
    worker: str
    reply: JoinReply


@dataclass(frozen=True)
class SetTimer:
    timer: Timer
    at: float


@dataclass(frozen=True)
class RecordFailure:
    """A worker failed: counted, reported, and the first one names the job's root cause."""

    worker: str
    host: str
    cause: str
    kind: str  # signal | exit_code | exception | spawn_error | check_in_timeout | hang
    rank: int | None = None
    exit_code: int | None = None


@dataclass(frozen=True)
class Report:
    """A telemetry call: `Telemetry.<name>(**fields)` (events and metrics)."""

    name: str
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Log:
    level: str  # debug | info | warning
    message: str


@dataclass(frozen=True)
class Finish:
    code: int


@dataclass(frozen=True)
class Fail:
    """The job stops; `message` is its one line (the first failure is appended)."""

    message: str


Action = (Spawn | StopWorkers | OpenRound | BreakRound | PostNotice | AnswerJoin | SetTimer
          | RecordFailure | Report | Log | Finish | Fail | ProbeRound | InspectWorkers)
