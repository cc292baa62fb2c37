"""Pure: the job's state as the JSON that GET /status returns (and `elasticrun status` shows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elasticrun.discovery.base import HostSlots
from elasticrun.driver.hosts.registry import BlacklistEntry
from elasticrun.driver.rounds.assignment import Assignment


@dataclass(frozen=True)
class JobView:
    """What the driver knows at one moment. `now` and the blacklist's times are monotonic;
    `wall_now` and `started_at` are wall-clock (time.time())."""

    job_id: str
    state: str  # starting | running | recovering | finishing | stopped
    now: float
    wall_now: float
    started_at: float
    round: int
    round_complete: bool
    assignment: Assignment
    standby_hosts: frozenset[str]
    discovered: HostSlots
    drained: frozenset[str]
    blacklist: dict[str, BlacklistEntry]
    slot_blacklist: dict[tuple[str, int], BlacklistEntry]
    np: int
    min_np: int
    max_np: int | None
    reset_limit: int | None
    discovery: str
    discovery_error: str | None
    epoch: int = 1  # the driver's: one more after each --resume
    restarts: int = 0  # whole restarts: a plain round's, or after a total loss
    last_restore: dict[str, Any] | None = None  # the last kept commit restored
    flash_commits: dict[str, Any] | None = None  # their cadence in force (flash_cadence.py)
    stragglers: dict[str, Any] | None = None  # --stragglers, and each member's pace


def host_states(view: JobView) -> dict[str, str]:
    """host -> active | starting | leaving | draining | drained | blacklisted | idle."""
    in_round = {slot.host for slot in view.assignment}
    states: dict[str, str] = {}
    for host in [*view.discovered, *sorted(in_round - set(view.discovered))]:
        entry = view.blacklist.get(host)
        blacklisted = entry is not None and (entry.until is None or entry.until > view.now)
        if blacklisted:
            states[host] = "blacklisted"
        elif host in view.drained:
            states[host] = "draining" if host in in_round else "drained"
        elif host in in_round:
            states[host] = "active" if host in view.discovered else "leaving"
        elif host in view.standby_hosts:
            states[host] = "starting"
        else:
            states[host] = "idle"
    return states


def build_status(view: JobView) -> dict[str, Any]:
    ranks: dict[str, list[int]] = {}
    for slot, info in sorted(view.assignment.items(), key=lambda item: item[1].rank):
        ranks.setdefault(slot.host, []).append(info.rank)
    states = host_states(view)
    hosts = [{"host": host, "slots": view.discovered.get(host, 0), "state": state,
              "ranks": ranks.get(host, [])} for host, state in states.items()]
    blacklist = [{"host": host, **_cooldown(view, entry)}
                 for host, entry in view.blacklist.items() if _in_force(view, entry)]
    slots = [{"host": host, "slot": index, **_cooldown(view, entry)}
             for (host, index), entry in view.slot_blacklist.items()
             if _in_force(view, entry)]
    return {
        "job_id": view.job_id,
        "driver_epoch": view.epoch,
        "state": view.state,
        "uptime_s": round(view.wall_now - view.started_at, 3),
        "round": view.round,
        "round_complete": view.round_complete,
        "world_size": len(view.assignment),
        "resets": max(0, view.round - 1),
        "reset_limit": view.reset_limit,
        "restarts": view.restarts,
        "last_restore": view.last_restore,
        "flash_commits": view.flash_commits,
        "stragglers": view.stragglers,
        "np": view.np, "min_np": view.min_np, "max_np": view.max_np,
        "hosts": hosts,
        "blacklist": blacklist,
        "blacklisted_slots": slots,
        "discovery": {"source": view.discovery, "last_error": view.discovery_error},
    }


def _in_force(view: JobView, entry: BlacklistEntry) -> bool:
    return entry.until is None or entry.until > view.now


def _cooldown(view: JobView, entry: BlacklistEntry) -> dict[str, Any]:
    left = None if entry.until is None else round(entry.until - view.now, 3)
    return {"failures": entry.failures, "cooldown_left_s": left,
            "cooldown_ends_at": None if left is None else round(view.wall_now + left, 3)}


def count_states(states: dict[str, str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for state in states.values():
        counts[state] = counts.get(state, 0) + 1
    return counts
