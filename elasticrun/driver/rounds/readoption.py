"""Pure: what a resumed driver does with the workers that report back to it.

Input: the state the journal kept (codec.decode), which workers have reported since the
resumed driver started serving (each with the round it is in), and whether the bound for
reporting has passed. Output: one decision. The rules, from the issue's contract:

- A job the journal shows ended is not resumed.
- A worker the journal does not know is told to exit (it belongs to no round of this job).
- The kept round complete, and every member back in it: re-adopted as they are, no
  rollback, no restart (their steps go on).
- Members missing when the bound passes: those are failed, and the usual recovery runs for
  them alone (the others roll back to their commit, as after any failure).
- A round that was still forming when the driver died (not complete), or a member back in
  another round than the kept one: a fresh round is opened with the workers that came back.
  A plain round (scripts that never call er.init(): restarts.py) is never forming: it runs.
- Otherwise: wait for more reports, until the bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from elasticrun.driver.rounds.restarts import plain
from elasticrun.driver.rounds.state import JobPhase, JobState


@dataclass(frozen=True)
class Refuse:
    reason: str


@dataclass(frozen=True)
class Wait:
    missing: tuple[str, ...]


@dataclass(frozen=True)
class Readopt:
    workers: tuple[str, ...]


@dataclass(frozen=True)
class FailMissing:
    missing: tuple[str, ...]  # failed; the usual recovery runs for them
    back: tuple[str, ...]


@dataclass(frozen=True)
class FreshRound:
    back: tuple[str, ...]  # the workers a new round is opened with
    why: str


Decision = Refuse | Wait | Readopt | FailMissing | FreshRound


def unknown(state: JobState, reported: Mapping[str, int]) -> tuple[str, ...]:
    """Workers that reported but that the journal does not know: told to exit."""
    return tuple(sorted(w for w in reported if w not in state.workers))


def decide(state: JobState, reported: Mapping[str, int], bound_passed: bool) -> Decision:
    """`reported`: worker id -> the round it says it is in."""
    if state.phase is JobPhase.STOPPED:
        return Refuse("the job had already ended when its driver stopped")
    known = {w: number for w, number in reported.items() if w in state.workers}
    back = tuple(sorted(known))
    current = state.round
    if current is None or not (current.complete or plain(state)):
        if not bound_passed and set(known) != _alive(state):
            return Wait(tuple(sorted(_alive(state) - set(known))))
        return FreshRound(back, "the driver stopped while a round was forming")
    members = set(current.members.values())
    elsewhere = sorted(w for w, number in known.items() if w in members
                       and number != current.number)
    if elsewhere:
        return FreshRound(back, f"worker {elsewhere[0]} is in round {known[elsewhere[0]]}, "
                                f"not {current.number}")
    missing = tuple(sorted(members - set(known)))
    if not missing:
        return Readopt(back)
    if not bound_passed:
        return Wait(missing)
    return FailMissing(missing, back)


def _alive(state: JobState) -> set[str]:
    return {w.id for w in state.workers.values() if w.alive}
