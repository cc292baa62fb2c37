"""Pure: whom a worker's failure blames — nobody in particular, its slot, or its host.

Most failures say nothing about the machine (a process killed, a transient NCCL or network
error): the worker's slot is refilled and the job goes on at full size. Only repeated
evidence leaves a slot or a host out, and then for a cooldown (the hosts' schedule,
--blacklist-cooldown-range), not for ever:

- Every failure of a worker is a *strike* against its slot (a slot is one local rank of
  one host: one GPU). A slot's strikes are forgiven as soon as one of its workers has
  *worked*: it reached a commit (a script that calls er.init()), or it ran WORKED_RUN_S as
  a member of its round (a torchrun-style script, which commits nothing elasticrun sees).
- A slot is left out at SLOT_STRIKES strikes: that many failures in a row, none of its
  workers having worked in between (a dead GPU fails the same local rank again and again).
- A host is left out when its slots' strikes add up to HOST_STRIKES, on two slots or more
  (a host whose every worker fails at start). Failures that point at the host itself (it
  cannot start workers, it does not answer, its agent is lost) blame it at once
  (slot_failures.py leaves those to Step.fail_host).
- A slot or host that reaches CRASH_LOOP_STRIKES while the job cannot train without it
  ends the job, naming it: every refill dies, and waiting for it would never end.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from elasticrun.driver.rounds.assignment import SlotId

SLOT_STRIKES = 3
HOST_STRIKES = 3
CRASH_LOOP_STRIKES = 5
WORKED_RUN_S = 60.0


@dataclass
class Strikes:
    """A slot's failures in a row, none of its workers having worked since the first."""

    count: int = 0
    cause: str = ""  # the last one's


class Blame(enum.Enum):
    NOBODY = "nobody"  # the slot is refilled at once
    SLOT = "slot"  # the slot is left out (its host's other slots go on)
    HOST = "host"  # the host is left out


@dataclass(frozen=True)
class Verdict:
    blame: Blame
    strikes: int  # of the slot (with Blame.HOST: of the host, all its slots together)
    slots: int = 1  # how many of its host's slots have strikes


def charge(strikes: dict[SlotId, Strikes], slot: SlotId, cause: str) -> Verdict:
    """Counts a failure of `slot` (its worker's `cause`) and says whom it blames."""
    record = strikes.setdefault(slot, Strikes())
    record.count += 1
    record.cause = cause
    on_host = [s.count for key, s in strikes.items() if key.host == slot.host]
    if len(on_host) >= 2 and sum(on_host) >= HOST_STRIKES:
        return Verdict(Blame.HOST, sum(on_host), len(on_host))
    if record.count >= SLOT_STRIKES:
        return Verdict(Blame.SLOT, record.count)
    return Verdict(Blame.NOBODY, record.count)


def worked(strikes: dict[SlotId, Strikes], slot: SlotId) -> bool:
    """One of the slot's workers worked: its strikes are forgiven. True if it had any."""
    return strikes.pop(slot, None) is not None


def crash_loop(verdict: Verdict) -> bool:
    """Whether the slot (or host) `verdict` blames has failed often enough in a row to end
    the job, when the job cannot train without it."""
    return verdict.blame is not Blame.NOBODY and verdict.strikes >= CRASH_LOOP_STRIKES


def ran_long_enough(started: float | None, now: float) -> bool:
    """A torchrun-style worker's proof of work: it has run WORKED_RUN_S."""
    return started is not None and now - started >= WORKED_RUN_S
