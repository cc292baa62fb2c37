"""Pure: what the round machine hears (events, timers) and what it asks for (actions).

Events come from the executor's parts (discovery, the worker server, the process pool,
signals, timers); actions go back to them. Both are plain frozen data, so that a test can
write "state, event -> actions" as a table.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from elasticrun.discovery.base import HostSlots
from elasticrun.driver.rounds.assignment import Assignment, SlotId
from elasticrun.protocol import HostUpdateResult, JoinReply
from elasticrun.system.process_view import ProcessView


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


# --- events ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobStarted:
    """The driver serves; `hosts` is the first discovery result."""

    hosts: HostSlots


@dataclass(frozen=True)
class JobResumed:
    """A resumed driver serves, its state read back from the journal (resume.py): the
    workers it kept get `bound_s` to come back."""

    epoch: int
    bound_s: float
    # Kept workers whose launcher ends them with their driver (SSH): failed at once, not
    # waited for.
    lost: tuple[str, ...] = ()


@dataclass(frozen=True)
class WorkerBack:
    """A worker the journal knows came back to the resumed driver (its agent said it runs
    it)."""

    worker: str


@dataclass(frozen=True)
class HostsFound:
    """A discovery poll answered (unchanged lists too: standbys may now be needed)."""

    hosts: HostSlots


@dataclass(frozen=True)
class HostsDrained:
    hosts: tuple[str, ...]


@dataclass(frozen=True)
class HostsAdded:
    """Pushed through the webhook: a drained host listed again is usable again."""

    hosts: tuple[str, ...]


@dataclass(frozen=True)
class WorkerStarted:
    worker: str


@dataclass(frozen=True)
class SpawnFailed:
    worker: str
    error: str


@dataclass(frozen=True)
class WorkerExited:
    worker: str
    code: int
    host_lost: bool = False  # it ended with the way to its host (a lost agent), not alone


@dataclass(frozen=True)
class JoinAsked:
    """A worker asks for its place in a round after `last_round` (long-poll)."""

    worker: str
    last_round: int
    failure: str = ""  # why it left its last round ("" : a host change, or its first join)
    committed: bool = False  # it committed in the round it leaves


@dataclass(frozen=True)
class InitCalled:
    """A worker's script called er.init(), before it asked to join: the job's rounds recover
    in-process (restarts.py)."""

    worker: str


@dataclass(frozen=True)
class WorkerFailing:
    """A worker's own error (not a peer's) ends it; it exits once it has printed it."""

    worker: str
    failure: str
    unrecoverable: bool = False  # the committed state cannot be restored: the job ends


@dataclass(frozen=True)
class WorkerSynced:
    worker: str
    round: int
    restored: tuple[int, str] | None = None  # the kept commit its sync restored, and where


@dataclass(frozen=True)
class WorkerTrained:
    """A worker completed its first commit: it has worked (its slot's failures before it are
    forgiven: evidence.py)."""

    worker: str


@dataclass(frozen=True)
class WorkerStalled:
    """A member has waited `waited_s` in a collective of `round`, far longer than its
    collectives take: a peer may be hung."""

    worker: str
    round: int
    waited_s: float


@dataclass(frozen=True)
class WorkerPaced:
    """A member's pace over its last `interval_s` of `round`: the share of the time its
    training thread spent outside collectives (stragglers.py)."""

    worker: str
    round: int
    busy: float
    interval_s: float


@dataclass(frozen=True)
class ProbeAnswered:
    """A member's notice watcher (a thread that does not train) answered probe `probe` of
    `round`. Its training thread is in a collective or not, and has been for `since_s`;
    it has used `cpu_s` seconds of CPU (None: unknown)."""

    worker: str
    round: int
    probe: int
    in_collective: bool
    since_s: float
    cpu_s: float | None


@dataclass(frozen=True)
class ProcessesInspected:
    """What the members' hosts say their processes are doing (asked by InspectWorkers)."""

    round: int
    views: tuple[tuple[str, ProcessView], ...]


@dataclass(frozen=True)
class TimerFired:
    timer: Timer


@dataclass(frozen=True)
class Interrupted:
    signal_name: str
    code: int


Event = (JobStarted | JobResumed | WorkerBack | HostsFound | HostsDrained | HostsAdded
         | WorkerStarted | SpawnFailed | WorkerExited | WorkerFailing | JoinAsked | WorkerSynced
         | TimerFired | Interrupted | WorkerStalled | ProbeAnswered | ProcessesInspected
         | InitCalled | WorkerTrained | WorkerPaced)


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
