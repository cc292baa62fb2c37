"""Pure: one step of the round machine — the state, the time, and the actions it collects.

Every decision function takes a Step; the helpers here are the moves they share (fail a
host, schedule the next cut, answer a join, stop the job).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from elasticrun.driver.rounds.actions import (
    Action,
    AnswerJoin,
    BreakRound,
    Fail,
    Finish,
    Log,
    RecordFailure,
    Report,
    SetTimer,
    Spawn,
    StopWorkers,
    Timer,
    TimerKind,
)
from elasticrun.driver.rounds.assignment import SlotId
from elasticrun.driver.rounds.state import JobPhase, JobState, WorkerRecord, WorkerStatus
from elasticrun.job.config import DriverConfig
from elasticrun.protocol import JoinReply

# The next round is cut this long after a member fails: at once (the event loop's next
# turn). Waiting for more failures would cost every recovery its length; a failure found
# later breaks the new round in turn.
FAILURE_COLLECTION_S = 0.0
# A failed worker that still runs (printing its error, or being stopped) holds its slot's
# refill back this long at most (a refill must not share a GPU with a dying process); then
# it is killed.
VACATE_WAIT_S = 5.0


@dataclass
class Step:
    state: JobState
    config: DriverConfig
    now: float
    new_worker_id: Callable[[SlotId], str]
    actions: list[Action] = field(default_factory=list)

    # --- output ------------------------------------------------------------------------
    def emit(self, action: Action) -> None:
        self.actions.append(action)

    def log(self, level: str, message: str) -> None:
        self.actions.append(Log(level, message))

    def report(self, name: str, **fields: Any) -> None:
        self.actions.append(Report(name, fields))

    def timer(self, kind: TimerKind, at: float, *, round: int = 0, worker: str = "",
              host: str = "", slot: int = -1) -> None:
        self.actions.append(SetTimer(Timer(kind, round=round, worker=worker, host=host,
                                           slot=slot), at))

    def answer(self, worker_id: str, reply: JoinReply) -> None:
        self.state.waiting_joins.pop(worker_id, None)
        self.actions.append(AnswerJoin(worker_id, reply))

    def record_failure(self, worker: WorkerRecord, cause: str, kind: str, *,
                       rank: int | None, exit_code: int | None = None) -> None:
        self.emit(RecordFailure(worker.id, worker.slot.host, cause, kind, rank, exit_code))

    # --- the job's end -------------------------------------------------------------------
    @property
    def stopped(self) -> bool:
        return self.state.phase is JobPhase.STOPPED

    def finish(self, code: int) -> None:
        if not self.stopped:
            self.state.phase = JobPhase.STOPPED
            self.emit(Finish(code))

    def fail(self, message: str) -> None:
        if not self.stopped:
            self.state.phase = JobPhase.STOPPED
            self.emit(Fail(message))

    # --- rounds ---------------------------------------------------------------------------
    def request_cut(self, delay: float) -> None:
        """The next round is cut after `delay` (or sooner, if already due sooner)."""
        state = self.state
        if state.phase in (JobPhase.FINISHING, JobPhase.STOPPED, JobPhase.STARTING):
            return
        at = self.now + delay
        if state.cut_at is None or at < state.cut_at:
            state.cut_at = at
            self.timer(TimerKind.CUT_ROUND, at)
        state.phase = JobPhase.RECOVERING

    def break_round(self, number: int) -> None:
        if number > self.state.broken_round:
            self.state.broken_round = number
            self.emit(BreakRound(number))

    def spawn(self, spawn: Spawn, occupant: WorkerRecord | None) -> None:
        """Starts a new worker in its slot, or once `occupant` (the slot's last worker, still
        alive: failing, or being stopped) is gone (slot_failures.vacated)."""
        if occupant is None or not occupant.alive or occupant.id == spawn.worker:
            self.emit(spawn)
            return
        self.state.deferred_spawns[spawn.worker] = spawn
        self.timer(TimerKind.VACATE, self.now + VACATE_WAIT_S, worker=occupant.id)

    def stop_workers(self, workers: list[WorkerRecord]) -> None:
        stopping = []
        for worker in workers:
            if self.state.deferred_spawns.pop(worker.id, None) is not None:
                worker.alive = False  # never started: nothing to stop
                worker.status = WorkerStatus.RELEASED
            elif worker.alive and worker.status in (WorkerStatus.RUNNING,
                                                    WorkerStatus.RELEASED):
                worker.status = WorkerStatus.STOPPING
                stopping.append(worker.id)
            else:
                continue
            self.state.growth.ids.discard(worker.id)
            self.state.growth.ready.discard(worker.id)
        if stopping:
            self.emit(StopWorkers(tuple(stopping)))

    def fail_host(self, host: str, cause: str) -> None:
        """Blacklists `host` and stops its workers. If members of the current round ran
        there, the round is broken: its members are told, and the next round is cut."""
        state, now = self.state, self.now
        if state.hosts.is_blacklisted(host, now):
            return  # already failed (its other workers report the same cause)
        entry = state.hosts.blacklist(host, now)
        cooldown = None if entry.until is None else entry.until - now
        until = "permanently" if cooldown is None else f"for {cooldown:.1f}s"
        self.log("warning", f"host {host} failed ({cause}); blacklisted {until}")
        self.report("host_blacklisted", host=host, cause=cause, cooldown_s=cooldown,
                    failures=entry.failures)
        if entry.until is not None:
            self.timer(TimerKind.COOLDOWN_END, entry.until, host=host)
        current = state.round
        breaks = current is None or any(slot.host == host for slot in current.members)
        self.stop_workers(state.live_on(host))
        if breaks:
            if current is not None:
                current.failed_hosts.add(host)
            self.member_lost(host, cause)

    def member_lost(self, host: str, cause: str) -> None:
        """A member of the current round (on `host`) failed: its round is broken (its members
        are told, they roll back) and the next round is cut."""
        state = self.state
        current = state.round
        if current is not None:
            current.worker_lost = True
            current.first_failure = current.first_failure or cause
        state.failed_unsettled.add(host)
        self.report("round_broken")
        self.break_round(state.round_number)
        self.request_cut(FAILURE_COLLECTION_S)
