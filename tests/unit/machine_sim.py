"""A clock and a timer wheel around the pure round machine, for table-style unit tests.

Nothing here decides anything: it feeds events to the real RoundMachine at a simulated
time, keeps the timers the machine asked for, and collects the actions it returned.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, TypeVar

from elasticrun.driver.rounds import events as ev
from elasticrun.driver.rounds.assignment import SlotId
from elasticrun.driver.rounds.machine import RoundMachine
from elasticrun.driver.rounds.state import JobState, WorkerRecord
from elasticrun.job.config import DriverConfig

A = TypeVar("A")


def config(**overrides: Any) -> DriverConfig:
    base = DriverConfig(command=("train",), np=4, min_np=2, max_np=None,
                        start_timeout=30.0, elastic_timeout=60.0, collective_timeout=10.0)
    return replace(base, **overrides)


class Sim:
    def __init__(self, cfg: DriverConfig | None = None, seed: int = 0,
                 elastic_scripts: bool = False) -> None:
        self.cfg = cfg or config()
        serial = itertools.count(1)
        self.machine = RoundMachine(self.cfg, lambda slot: f"{slot.host}.{slot.index}#"
                                    f"{next(serial)}", random.Random(seed), elastic_scripts)
        self.now = 1000.0
        self.timers: list[tuple[float, ev.Timer]] = []
        self.log: list[ev.Action] = []

    @property
    def state(self) -> JobState:
        return self.machine.state

    # --- feeding events -----------------------------------------------------------------
    def send(self, event: ev.Event) -> list[ev.Action]:
        actions = self.machine.handle(event, self.now)
        for action in actions:
            if isinstance(action, ev.SetTimer):
                self.timers.append((action.at, action.timer))
        self.timers.sort(key=lambda entry: entry[0])
        self.log.extend(actions)
        return actions

    def advance(self, seconds: float) -> list[ev.Action]:
        """Moves the clock, firing due timers in order; returns what they caused."""
        end = self.now + seconds
        out: list[ev.Action] = []
        while self.timers and self.timers[0][0] <= end:
            at, timer = self.timers.pop(0)
            self.now = max(self.now, at)
            out += self.send(ev.TimerFired(timer))
        self.now = end
        return out

    # --- the usual sequences -------------------------------------------------------------
    def start(self, hosts: dict[str, int]) -> list[ev.Action]:
        actions = self.send(ev.JobStarted(hosts))
        return actions + self.started(actions)

    def started(self, actions: Iterable[ev.Action]) -> list[ev.Action]:
        """Every spawn in `actions` succeeded."""
        out: list[ev.Action] = []
        for spawn in of(ev.Spawn, actions):
            out += self.send(ev.WorkerStarted(spawn.worker))
        return out

    def members(self) -> list[WorkerRecord]:
        current = self.state.round
        assert current is not None
        return [self.state.workers[w] for w in current.members.values()]

    def join_all(self, last_round: int = 0, failure: str = "",
                 committed: bool = False) -> list[ev.Action]:
        out: list[ev.Action] = []
        for worker in self.members():
            out += self.send(ev.JoinAsked(worker.id, last_round, failure, committed))
        return out

    def sync_all(self) -> list[ev.Action]:
        out: list[ev.Action] = []
        for worker in self.members():
            out += self.send(ev.WorkerSynced(worker.id, self.state.round_number))
        return out

    def running(self, hosts: dict[str, int]) -> None:
        """Started, round 1 complete, every member synced and through its first commit."""
        self.start(hosts)
        self.join_all()
        self.sync_all()
        for worker in self.members():
            self.send(ev.WorkerTrained(worker.id))

    def worker_on(self, host: str, index: int = 0) -> WorkerRecord:
        """The newest live worker in that slot (stopping ones too)."""
        slot = SlotId(host, index)
        return [w for w in self.state.workers.values() if w.slot == slot and w.alive][-1]


def of(kind: type[A], actions: Iterable[ev.Action]) -> list[A]:
    return [a for a in actions if isinstance(a, kind)]


def reports(actions: Iterable[ev.Action]) -> list[str]:
    return [a.name for a in of(ev.Report, actions)]


def answers(actions: Iterable[ev.Action]) -> dict[str, str]:
    return {a.worker: a.reply.action for a in of(ev.AnswerJoin, actions)}
