"""Pure: everything the round machine knows about the job, in one object.

The job's phase is stored, not rebuilt from flags; rounds, workers, standbys, reset requests,
notices and who holds the committed training state all live here, and only the machine
(machine.py) changes them.
"""

from __future__ import annotations

import enum
from collections import Counter, deque
from dataclasses import dataclass, field

from elasticrun.driver.hosts.registry import HostRegistry
from elasticrun.driver.rounds.actions import Spawn
from elasticrun.driver.rounds.assignment import Assignment, SlotId
from elasticrun.driver.rounds.evidence import Strikes
from elasticrun.driver.rounds.pace import PaceBook
from elasticrun.system.process_view import ProcessView


class JobPhase(enum.Enum):
    STARTING = "starting"      # waiting for enough hosts; no round opened yet
    RUNNING = "running"        # a round is open (its members may still be joining)
    RECOVERING = "recovering"  # the next round is being cut (failures, resets, capacity)
    FINISHING = "finishing"    # a member exited 0: the others are expected to follow
    STOPPED = "stopped"        # finished, failed or interrupted


class WorkerStatus(enum.Enum):
    RUNNING = "running"      # alive and holding its slot (a member or a standby)
    RELEASED = "released"    # has no place any more; its exit is neither success nor failure
    STOPPING = "stopping"    # the driver is stopping it
    FINISHED = "finished"    # exited 0 as a member of the current round
    FAILED = "failed"        # exited non-zero on its own, or could not be started


@dataclass
class WorkerRecord:
    id: str
    slot: SlotId
    rank: int
    standby: bool = False  # started for a round not yet opened
    status: WorkerStatus = WorkerStatus.RUNNING
    alive: bool = True
    joined_round: int = 0  # the last round it joined; 0: none yet (it is starting up)
    synced_round: int = 0  # the last round whose committed state it holds; 0: none
    checked_in: bool = False  # a standby that asked to join
    started_at: float | None = None  # when its process was started (None: not yet)


@dataclass
class Round:
    number: int
    assignment: Assignment
    members: dict[SlotId, str]  # slot -> worker id holding it
    notice_seq: int  # the newest host-change notice this round reflects
    opened_at: float
    joined: set[str] = field(default_factory=set)
    synced: set[str] = field(default_factory=set)  # members that reported holding the state
    complete: bool = False
    settled: bool = False  # every member reported holding the committed state
    worker_lost: bool = False  # a member (or its host) failed while this round was current
    failed_hosts: set[str] = field(default_factory=set)  # hosts failed while it was current
    first_failure: str = ""  # the cause of the first failure
    # Membership checks in O(1): a round of N joins must not cost O(N^2).
    member_ids: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self.member_ids = frozenset(self.members.values())

    def missing(self) -> list[SlotId]:
        return [slot for slot, worker in self.members.items() if worker not in self.joined]


@dataclass
class ResetRequest:
    """A member asked for the next round: why (its failure, or "" for a host change) and
    whether it committed in the round it leaves."""

    worker_id: str
    rank: int
    host: str
    failure: str
    committed: bool


@dataclass
class Growth:
    """The next round, while its new workers start as standbys and the current one trains."""

    target: Assignment | None = None
    ids: set[str] = field(default_factory=set)
    ready: set[str] = field(default_factory=set)
    notified: Assignment | None = None

    def clear(self) -> None:
        self.target = self.notified = None
        self.ids.clear()
        self.ready.clear()


@dataclass
class Storm:
    """Rounds that ended one after the other by a failure that no host failure explains,
    with no commit in between: the same failure over and over."""

    count: int = 0
    culprits: Counter[tuple[int, str, str]] = field(default_factory=Counter)

    def clear(self) -> None:
        self.count = 0
        self.culprits.clear()


@dataclass
class Stall:
    """A round whose collectives wait far longer than usual, while it lasts: its members are
    probed, and their hosts asked, until the hung one is found or the wait ends."""

    round: int
    started: float
    last_report: float  # stalled members repeat their reports while they wait
    probe: int = 0  # the probe the members are answering now
    next_probe: float = 0.0  # when they are asked again
    answered: set[str] = field(default_factory=set)  # answered the current probe
    heard: dict[str, float] = field(default_factory=dict)  # worker -> last answer or report
    outside: dict[str, float] = field(default_factory=dict)  # its training thread left its
    #                                           collectives at (absent: it is in one)
    cpu: dict[str, tuple[float, float]] = field(default_factory=dict)  # worker -> (its training
    #                                           thread's CPU seconds, unchanged since)
    views: dict[str, ProcessView] = field(default_factory=dict)  # worker -> its host's answer


@dataclass
class Resume:
    """A resumed driver's wait for the workers its journal kept."""

    epoch: int
    started: float
    expected: int  # the workers the journal kept, alive
    back: set[str] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)  # died with the old driver: not waited for
    decided: bool = False  # who is back is settled; discovery may still be catching up
    hosts: dict[str, int] | None = None  # discovery's latest answer, held until it agrees
    # Not back yet (so that each worker's return costs O(1), not a pass over every worker):
    # kept workers, less those lost, and the members of the kept round.
    awaited: deque[str] = field(default_factory=deque)  # in turn; those back are skipped
    members_awaited: set[str] = field(default_factory=set)


@dataclass
class Restart:
    """A round whose scripts never called er.init() is restarted whole (restarts.py): its
    members are being stopped; the next round opens, every slot a new worker, once they
    are gone, or at `deadline`. Whether it counts against --max-restarts is decided then."""

    deadline: float
    cause: str = ""  # the failure that began it ("": the hosts changed, never counted)
    kind: str = ""  # that failure's kind (exits.exit_kind, "exception", "hang", ...)
    began: float = 0.0
    explained: bool = False  # a member was lost with its host meanwhile: a host change
    settled: bool = False  # counted (or not) already


@dataclass
class JobState:
    hosts: HostRegistry
    phase: JobPhase = JobPhase.STARTING
    workers: dict[str, WorkerRecord] = field(default_factory=dict)
    round: Round | None = None
    cut_at: float | None = None  # when the next round is cut (failures are collected first)
    capacity_deadline: float | None = None  # --elastic-timeout, while short of --min-np
    last_call_until: float | None = None  # the first round waits for more slots until then
    sync_grace_until: float | None = None  # reports of a completed sync may be on their way
    resets: dict[str, ResetRequest] = field(default_factory=dict)
    notice_seq: int = 0
    broken_round: int = 0
    state_committed: bool = False  # some worker has reported holding training state
    waiting_joins: dict[str, int] = field(default_factory=dict)  # held join: id -> last round
    hold_timer_round: int = 0  # the round whose hold-leaving timer is set
    growth: Growth = field(default_factory=Growth)
    storm: Storm = field(default_factory=Storm)
    stall: Stall | None = None  # the current round's, while one lasts (liveness.py)
    pace: PaceBook = field(default_factory=PaceBook)  # the members' pace (stragglers.py)
    probe_seq: int = 0  # the last probe number given out (probes of every round count)
    resume: Resume | None = None  # a resumed driver waiting for its workers (resume.py)
    elastic_scripts: bool = False  # a worker called er.init(): rounds recover in-process
    restarts: int = 0  # rounds restarted whole after a failure (TORCHELASTIC_RESTART_COUNT)
    restart: Restart | None = None  # the current round's members are being stopped
    restoring: bool = False  # the next round replaces workers that were all lost (total_loss)
    # (worker id, cause): a worker cannot restore the committed state (UnrecoverableStateError):
    # the job ends once that worker has exited (its traceback printed).
    unrecoverable: tuple[str, str] | None = None
    lost_round: int = 0  # the last round whose total loss was restarted (counted once)
    # Hosts failed (or with slots blacklisted) since a round last settled (every member
    # synced): a total loss gives them back, whichever of the rounds opened meanwhile (from
    # workers already dead) they failed in.
    failed_unsettled: set[str] = field(default_factory=set)
    # Each slot's failures in a row, none of its workers having worked since (evidence.py).
    strikes: dict[SlotId, Strikes] = field(default_factory=dict)
    # Some worker of the job has worked (reached a commit, or ran evidence.WORKED_RUN_S in
    # restart mode): until then, failures are taken for the job's configuration, not luck.
    trained: bool = False
    # New workers whose slot a failed worker still occupies (it is exiting): started once
    # it is gone (slot_failures.py), by worker id.
    deferred_spawns: dict[str, Spawn] = field(default_factory=dict)
    # host -> its usable slots that fill no replica group (--shard-size), as last logged
    left_over: dict[str, int] = field(default_factory=dict)

    @property
    def round_number(self) -> int:
        return self.round.number if self.round is not None else 0

    @property
    def assignment(self) -> Assignment:
        return self.round.assignment if self.round is not None else {}

    def holders(self) -> dict[SlotId, WorkerRecord]:
        """slot -> the live worker holding it (a member or a standby), in one pass."""
        return {w.slot: w for w in self.workers.values()
                if w.alive and w.status is WorkerStatus.RUNNING}

    def is_member(self, worker_id: str) -> bool:
        return self.round is not None and worker_id in self.round.member_ids

    def live_on(self, host: str) -> list[WorkerRecord]:
        return [w for w in self.workers.values() if w.alive and w.slot.host == host]
