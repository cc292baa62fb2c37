"""Pure: what the round machine hears — events, timers' firings among them.

Events come from the executor's parts (discovery, the worker server, the process pool,
signals, timers); what the machine asks for in return is in actions.py. Both are plain frozen
data, so that a test can write "state, event -> actions" as a table.
"""

from __future__ import annotations

from dataclasses import dataclass

from elasticrun.discovery.base import HostSlots

# Re-exported: the executor, the server, the timeline and the tests (19 modules) name events
# and actions alike through this module (`from elasticrun.driver.rounds import events as ev`).
from elasticrun.driver.rounds.actions import (  # noqa: F401 - re-exported
    Action,
    AnswerJoin,
    BreakRound,
    Fail,
    Finish,
    InspectWorkers,
    Log,
    OpenRound,
    PostNotice,
    ProbeRound,
    RecordFailure,
    Report,
    SetTimer,
    Spawn,
    StopWorkers,
    Timer,
    TimerKind,
)
from elasticrun.system.process_view import ProcessView


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
