"""The goodput benchmark's faults: what each kind does to a running job, and the schedule
that every tool suffers (benchmarks/goodput.py).

A fault kind is one small class in KINDS: `inject` does it to a job (and says what it did);
a fault that lasts (`Fault.lasts_s`) is undone by `restore` that many seconds later. A job
is seen through `Target`, which every tool provides.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Protocol

from restart_jobs import stat_fields

HOST_A, HOST_B = "127.0.0.1", "127.0.0.2"
HOSTS = (HOST_A, HOST_B)  # torchrun's c10d store lives with HOST_A's launcher
EVERY_HOST = ""


class Target(Protocol):
    """A running job, as the faults see it."""

    def workers(self, host: str) -> list[int]:
        """The live worker processes on `host` (EVERY_HOST: on all), oldest first."""
        ...

    def drop_host(self, host: str) -> None:
        """The host is gone: out of discovery (elasticrun), its launcher killed (torchrun)."""
        ...

    def restore_host(self, host: str) -> None:
        """The host is back: listed again, or its launcher started again."""
        ...

    def slow_slot(self, host: str, index: int, factor: float | None) -> None:
        """Slot `index` of `host` works `factor` times slower (None: at its pace again)."""
        ...


@dataclass(frozen=True)
class Fault:
    """One fault of the schedule: `at_s` seconds after training started, on `host`."""

    at_s: float
    kind: str
    host: str = EVERY_HOST
    lasts_s: float = 0.0

    @property
    def label(self) -> str:
        where = f" {self.host}" if self.host else ""
        lasting = f" for {self.lasts_s:g} s" if self.lasts_s else ""
        return f"{self.kind}{where}{lasting}"


def signal_all(pids: list[int], sig: signal.Signals) -> list[int]:
    """Sends `sig` to each process still there; the ones it reached."""
    reached = []
    for pid in pids:
        try:
            os.kill(pid, sig)
            reached.append(pid)
        except ProcessLookupError:
            pass
    return reached


def is_stopped(pid: int) -> bool:
    stat = stat_fields(pid)
    return stat is not None and stat[0] == "T"


class FaultKind:
    """What a kind of fault does to a job."""

    def inject(self, target: Target, host: str) -> str:
        """Does it; says what it did (the processes it reached)."""
        raise NotImplementedError

    def restore(self, target: Target, host: str) -> None:
        """Undoes a lasting fault (`Fault.lasts_s` after `inject`)."""


@dataclass(frozen=True)
class SignalNewest(FaultKind):
    """The newest running worker on the host gets `sig`: SIGKILL is a transient death,
    SIGSTOP a hang (left so until its tool acts; the benchmark SIGKILLs what is still
    stopped at the end)."""

    sig: signal.Signals
    verb: str

    def inject(self, target: Target, host: str) -> str:
        running = [pid for pid in target.workers(host) if not is_stopped(pid)]
        if not running:
            return f"no running worker on {host or 'any host'} to {self.verb}"
        return f"{self.verb} {signal_all(running[-1:], self.sig)}"


class KillAll(FaultKind):
    """Every worker lost at once."""

    def inject(self, target: Target, host: str) -> str:
        return f"kill {signal_all(target.workers(host), signal.SIGKILL)}"


class HostAway(FaultKind):
    """A host goes away (its workers killed; out of discovery, or its launcher killed) and
    comes back `lasts_s` later."""

    def inject(self, target: Target, host: str) -> str:
        killed = signal_all(target.workers(host), signal.SIGKILL)
        target.drop_host(host)
        return f"kill {killed}, host dropped"

    def restore(self, target: Target, host: str) -> None:
        target.restore_host(host)


@dataclass(frozen=True)
class SlowSlot(FaultKind):
    """A straggler: one slot of the host works `factor` times slower (a throttled GPU),
    whichever worker holds it, while the fault lasts."""

    index: int = 1
    factor: float = 5.0

    def inject(self, target: Target, host: str) -> str:
        target.slow_slot(host, self.index, self.factor)
        return f"slot {host}[{self.index}] {self.factor:g}x slower"

    def restore(self, target: Target, host: str) -> None:
        target.slow_slot(host, self.index, None)


KINDS: dict[str, FaultKind] = {"kill": SignalNewest(signal.SIGKILL, "kill"),
                               "hang": SignalNewest(signal.SIGSTOP, "stop"),
                               "kill-all": KillAll(), "host-away": HostAway(),
                               "slow": SlowSlot()}


@dataclass(frozen=True)
class Plan:
    """What every tool suffers: the faults, over how long, on how many slots per host."""

    schedule: tuple[Fault, ...]
    duration_s: float
    slots: int

    @property
    def full(self) -> int:
        return self.slots * len(HOSTS)


# About one fault a minute, each tool given time to recover before the next; a straggler
# (one slot 5x slower for 25 s) between the host's return and the next kill. The hang comes
# last: torchrun takes ~2 minutes over it here (its process group's timeout, 60 s, then its
# agent's stop of the stopped worker, then a restart).
PLAN = Plan((Fault(15, "kill", HOST_B), Fault(45, "kill-all"),
             Fault(75, "host-away", HOST_B, lasts_s=25), Fault(105, "slow", HOST_B, lasts_s=25),
             Fault(135, "kill", HOST_A), Fault(165, "hang", HOST_A)), duration_s=300.0,
            slots=2)
# Quick (the smoke test): the machinery, not the figures. One worker per host (half the
# start-up), the host away briefly and every worker lost; no hang (torchrun: a minute).
QUICK_PLAN = Plan((Fault(2, "host-away", HOST_B, lasts_s=3), Fault(6, "kill-all")),
                  duration_s=10.0, slots=1)
