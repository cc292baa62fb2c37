"""Pure: what the job does about a straggler (fail-slow) — names it, and may take it out.

The members' pace reports are judged in pace.py. A member newly named a straggler is said
everywhere a user looks (a log line with its rank, host and slowdown; a `straggler` event;
/status; a mark in the timeline); `straggler_cleared` when it keeps up again. Each tick also
sets the per-rank slowdown gauge.

With `--stragglers evict` the straggler's slot (its replica group, with --shard-size) is
left out as a failed slot is (the hosts' cooldown schedule: it may come back later, and
stays out longer each time), and the round moves on without it at its next commit, as for a
drained host: no rollback, no work lost (a torchrun-style round restarts without it). Only
when the job keeps --min-np slots and is projected faster without it (pace.projected_gain);
otherwise the event says why it stays.
"""

from __future__ import annotations

from typing import Any

from elasticrun.driver.rounds import growth, pace, restarts, slot_failures
from elasticrun.driver.rounds.events import TimerKind, WorkerPaced
from elasticrun.driver.rounds.evidence import Blame
from elasticrun.driver.rounds.state import JobPhase, JobState
from elasticrun.driver.rounds.step import Step

EVICT, OFF = "evict", "off"  # (config.STRAGGLERS)


def paced(step: Step, event: WorkerPaced) -> None:
    """A member's pace report: noted, and the round judged when a tick is due."""
    state, config = step.state, step.config
    current = state.round
    if config.stragglers == OFF or current is None or state.phase is not JobPhase.RUNNING \
            or not (current.complete or restarts.plain(state)) \
            or event.round != current.number or not state.is_member(event.worker):
        return  # (a torchrun-style round is never "complete": its members never join)
    book = state.pace
    pace.note(book, event.worker, pace.PaceReport(event.round, event.busy, event.interval_s),
              step.now)
    changes = pace.tick(book, current.member_ids, current.number, step.now)
    if changes is None:
        return
    ranks = _ranks(step)
    step.report("worker_slowdowns", slowdowns=[
        (rank, host, round(book.tracks[worker].slowdown(), 3))
        for worker, (rank, host) in sorted(ranks.items(), key=lambda item: item[1])])
    for change in changes:
        rank, host = ranks[change.worker]
        if change.named:
            _named(step, change, rank, host)
        else:
            step.log("info", f"rank {rank} on host {host} keeps up again (a straggler no "
                             f"longer: {change.slowdown:.2f}x its peers' pace)")
            step.report("straggler_cleared", rank=rank, host=host,
                        slowdown=round(change.slowdown, 2))


def _named(step: Step, change: pace.Change, rank: int, host: str) -> None:
    state, config = step.state, step.config
    worker = state.workers[change.worker]
    members = state.round.member_ids if state.round is not None else frozenset()
    gain = pace.projected_gain(pace.typical_busy(state.pace, members), change.worker)
    action, reason = "reported", "--stragglers report"
    if config.stragglers == EVICT:
        if not slot_failures.goes_on_without(step, worker.slot, Blame.SLOT):
            action, reason = "kept", (f"without it the job would have fewer than --min-np "
                                      f"{config.min_np} slots")
        elif gain < pace.EVICT_GAIN:
            action, reason = "kept", (f"the job is projected no faster without it "
                                      f"({gain:.2f}x its speed now)")
        else:
            action, reason = "evicted", (f"the job is projected {gain:.1f}x faster without "
                                         f"it")
    leaves = "the round restarts without it" if restarts.plain(state) \
        else "it leaves at the next commit"
    what = {"reported": "reported only", "kept": "not evicted", "evicted": leaves}[action]
    step.log("warning", f"rank {rank} on host {host} is a straggler: {change.slowdown:.1f}x "
                        f"slower than its peers, for {pace.PERSIST} of the last "
                        f"{pace.WINDOW} seconds; {what} ({reason})")
    step.report("straggler", rank=rank, host=host, slowdown=round(change.slowdown, 2),
                action=action, reason=reason, projected_gain=round(gain, 2))
    if action == "evicted":
        _evict(step, change.worker, change.slowdown)


def _evict(step: Step, worker_id: str, slowdown: float) -> None:
    """Leaves the straggler's slot (replica group) out with the hosts' cooldowns; the round
    is told to make room at its next commit (growth.plan)."""
    state, now = step.state, step.now
    slot = state.workers[worker_id].slot
    cause = f"a straggler, {slowdown:.1f}x slower than its peers"
    for member in slot_failures.replica_group(slot, step.config.shard_size):
        entry = state.hosts.blacklist_slot(member.host, member.index, now)
        cooldown = None if entry.until is None else entry.until - now
        until = "permanently" if cooldown is None else f"for {cooldown:.1f}s"
        step.log("warning", f"slot {member} left out {until}: {cause}")
        step.report("slot_blacklisted", host=member.host, slot=member.index, cause=cause,
                    cooldown_s=cooldown, failures=entry.failures)
        if entry.until is not None:
            step.timer(TimerKind.COOLDOWN_END, entry.until, host=member.host,
                       slot=member.index)
    pace.forget(state.pace, worker_id)
    growth.plan(step)


def _ranks(step: Step) -> dict[str, tuple[int, str]]:
    """worker id -> (rank, host) for the current round's members."""
    current = step.state.round
    if current is None:
        return {}
    return {worker: (current.assignment[slot].rank, slot.host)
            for slot, worker in current.members.items()}


def pace_view(state: JobState) -> list[dict[str, Any]]:
    """/status: each member's rank, host, slowdown at the latest tick and whether it is a
    straggler now (empty before the round's first tick)."""
    current = state.round
    if current is None:
        return []
    members = []
    for slot, worker in sorted(current.members.items(),
                               key=lambda item: current.assignment[item[0]].rank):
        track = state.pace.tracks.get(worker)
        if track is not None and track.slowdowns:
            members.append({"rank": current.assignment[slot].rank, "host": slot.host,
                            "slowdown": round(track.slowdowns[-1], 2),
                            "straggler": track.named})
    return members


def forget(step: Step, worker_id: str) -> None:
    pace.forget(step.state.pace, worker_id)
