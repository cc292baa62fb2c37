"""A real round machine behind a real worker server on 127.0.0.1, and a minimal executor.

`RoundsServer` is what the driver is to the server, less the processes: every request the
server turns into an event goes through the driver's own EventQueue to a real
`RoundMachine`, and the machine's server-facing actions are carried out by the server itself
(`WorkerServer.carry_out`), as in the driver; timers fire as in the driver. Everything else
(Spawn, StopWorkers, Report, Log, Finish...) is only recorded (a Spawn starts no process):
tests assert on `events` and `actions`.

The seeding helpers (`add_worker`, `open_round`, `break_round`, `post_notice`) set up a
test's preconditions in the machine's state directly, without going through the machine;
the behaviour under test goes through the server and the machine.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from elasticrun.driver.processes.records import new_worker_id
from elasticrun.driver.queue import EventQueue
from elasticrun.driver.rounds import events as ev
from elasticrun.driver.rounds.assignment import Assignment, SlotId
from elasticrun.driver.rounds.machine import RoundMachine
from elasticrun.driver.rounds.state import JobPhase, JobState, Round, WorkerRecord
from elasticrun.driver.server.app import WorkerServer
from elasticrun.driver.server.kvstore import KVStore
from elasticrun.driver.server.rounds_api import RoundEndpoints
from elasticrun.job.config import DriverConfig
from elasticrun.protocol import HostUpdateResult, JoinReply

# A join without a place is held (a last copy of the committed state) for start_timeout +
# collective_timeout after its round opened: a minute, longer than any test waits.
CONFIG = DriverConfig(command=("x",), np=1, min_np=1, max_np=None, start_timeout=30.0,
                      collective_timeout=30.0)


class RoundsServer:
    def __init__(self, secret: str, config: DriverConfig = CONFIG, epoch: int = 1) -> None:
        self.machine = RoundMachine(config, new_worker_id)
        self.superseded_by: list[int] = []  # newer epochs its requests named (fencing)
        self.server = WorkerServer(secret, self.machine.state, self.post, epoch=epoch,
                                   superseded=self.superseded_by.append)
        self.events: list[ev.Event] = []
        self.actions: list[ev.Action] = []
        self.port = 0
        self._queue = EventQueue(self._handle, self.server.carry_out)

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self, extra_routes: Iterable[web.RouteDef] = (), port: int = 0) -> int:
        self.port = await self.server.start("127.0.0.1", port, extra_routes)
        return self.port

    async def stop(self) -> None:
        self._queue.close()
        await self.server.stop()

    # --- the executor -------------------------------------------------------------------
    def post(self, event: ev.Event) -> None:
        self._queue.post(event)

    def _handle(self, event: ev.Event, now: float) -> list[ev.Action]:
        self.events.append(event)
        actions = self.machine.handle(event, now)
        self.actions.extend(actions)
        return actions

    # --- what tests read ------------------------------------------------------------------
    @property
    def state(self) -> JobState:
        return self.machine.state

    @property
    def store(self) -> KVStore:
        return self.server.kv.store

    @property
    def rounds(self) -> RoundEndpoints:
        return self.server.rounds

    @property
    def current(self) -> Round:
        assert self.state.round is not None, "no round is open"
        return self.state.round

    def worker(self, worker_id: str) -> WorkerRecord:
        return self.state.workers[worker_id]

    def of(self, kind: type) -> list[Any]:
        """The recorded actions (or events) of one type, in order."""
        return [a for a in [*self.actions, *self.events] if isinstance(a, kind)]

    def answers(self, action: str | None = None) -> list[tuple[str, JoinReply]]:
        """(worker, reply) of every AnswerJoin, optionally of one reply action."""
        return [(a.worker, a.reply) for a in self.of(ev.AnswerJoin)
                if action is None or a.reply.action == action]

    def reports(self, name: str) -> list[dict[str, Any]]:
        return [dict(a.fields) for a in self.of(ev.Report) if a.name == name]

    def logs(self, fragment: str) -> list[str]:
        return [a.message for a in self.of(ev.Log) if fragment in a.message]

    def timers(self, kind: ev.TimerKind) -> list[ev.Timer]:
        return [a.timer for a in self.of(ev.SetTimer) if a.timer.kind is kind]

    # --- seeding preconditions (the machine's state, directly) -----------------------------
    def add_worker(self, worker_id: str, slot: SlotId, standby: bool = False,
                   rank: int = -1) -> WorkerRecord:
        """A live worker holding `slot` (a process that started); `standby`: started for a
        round not yet opened."""
        worker = WorkerRecord(worker_id, slot, rank, standby=standby)
        self.state.workers[worker_id] = worker
        return worker

    def open_round(self, number: int, assignment: Assignment,
                   members: dict[SlotId, str]) -> Round:
        """Round `number` is current, as the machine's cut leaves it (its members must have
        been added); the hosts are those of `assignment`. Tells the server, like the
        executor does for OpenRound. The job's script calls er.init() (no restart mode)."""
        state = self.state
        state.elastic_scripts = True
        hosts = Counter(slot.host for slot in assignment)
        state.hosts.update(dict(hosts))
        state.round = Round(number, dict(assignment), dict(members), state.notice_seq,
                            time.monotonic())
        state.phase = JobPhase.RUNNING
        state.cut_at = None
        state.resets.clear()
        state.growth.clear()
        for worker in state.workers.values():
            worker.standby = False  # standbys are members now, or have no place
        for slot, worker_id in members.items():
            assert worker_id in state.workers, f"add_worker({worker_id!r}) first"
            state.workers[worker_id].rank = assignment[slot].rank
        self.server.carry_out(ev.OpenRound(number, dict(assignment), 0))
        return state.round

    def break_round(self, number: int) -> None:
        """Round `number` broke (as the machine's BreakRound leaves it)."""
        self.state.broken_round = max(self.state.broken_round, number)
        self.server.carry_out(ev.BreakRound(number))

    def post_notice(self) -> int:
        """A host-change notice (as the machine's PostNotice leaves it); its sequence number."""
        self.state.notice_seq += 1
        self.server.carry_out(ev.PostNotice(self.state.notice_seq, HostUpdateResult.added))
        return self.state.notice_seq
