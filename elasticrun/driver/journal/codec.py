"""Pure: the round machine's state as a journal snapshot body (JSON), and back.

What a resumed driver cannot learn back from the workers is kept: the phase, every worker's
record (its slot, rank, the rounds it joined and whose committed state it holds), the
current round (its assignment, members, who joined and synced), the notice and probe
sequences, the broken round, whether a commit exists, whether the scripts call er.init()
and how often their rounds restarted, the hosts (discovered, blacklisted with their
cooldowns, drained), the slots blacklisted, and each slot's failures in a row. What only
matters while one driver lives is not kept: timers (a cut, the capacity and sync-grace
deadlines, a stall's probes), reset requests, held joins, a growth in progress, a restart in
progress, refills waiting for a failed worker to exit and the storm count; a resumed driver
starts those afresh.

The machine's clock is monotonic, which does not survive a restart: times are kept as wall
clock and turned back into the new driver's monotonic clock (`now` and `wall` name the same
moment, one on each clock).
"""

from __future__ import annotations

from typing import Any

from elasticrun.driver.hosts.registry import BlacklistEntry, HostRegistry
from elasticrun.driver.rounds.assignment import SlotId
from elasticrun.driver.rounds.evidence import Strikes
from elasticrun.driver.rounds.state import JobPhase, JobState, Round, WorkerRecord, WorkerStatus
from elasticrun.protocol import SlotInfo

VERSION = 1


def _slot(slot: SlotId) -> list[Any]:
    return [slot.host, slot.index]


def _slot_id(data: list[Any]) -> SlotId:
    host, index = data
    return SlotId(str(host), int(index))


def encode(state: JobState, now: float, wall: float) -> dict[str, Any]:
    """The journal body of `state`, at monotonic `now` = wall-clock `wall`."""
    def to_wall(moment: float) -> float:
        return moment - now + wall

    round_ = state.round
    return {
        "version": VERSION,
        "phase": state.phase.value,
        "notice_seq": state.notice_seq,
        "broken_round": state.broken_round,
        "state_committed": state.state_committed,
        "probe_seq": state.probe_seq,
        "elastic_scripts": state.elastic_scripts,
        "restarts": state.restarts,
        "trained": state.trained,
        "workers": [{"id": w.id, "slot": _slot(w.slot), "rank": w.rank, "standby": w.standby,
                     "status": w.status.value, "alive": w.alive,
                     "joined_round": w.joined_round, "synced_round": w.synced_round,
                     "checked_in": w.checked_in,
                     "started_at": None if w.started_at is None else to_wall(w.started_at)}
                    for w in state.workers.values()],
        "round": None if round_ is None else {
            "number": round_.number,
            "assignment": [[_slot(slot), info.to_json()]
                           for slot, info in round_.assignment.items()],
            "members": [[_slot(slot), worker] for slot, worker in round_.members.items()],
            "notice_seq": round_.notice_seq,
            "opened_at": to_wall(round_.opened_at),
            "joined": sorted(round_.joined),
            "synced": sorted(round_.synced),
            "complete": round_.complete,
            "settled": round_.settled,
            "worker_lost": round_.worker_lost,
        },
        "hosts": {
            "discovered": [[host, slots] for host, slots in state.hosts.discovered.items()],
            "blacklist": {host: {"failures": entry.failures,
                                 "until": None if entry.until is None else to_wall(entry.until)}
                          for host, entry in state.hosts.blacklist_snapshot().items()},
            "drained": sorted(state.hosts.drained),
            "slot_blacklist": [[host, index, entry.failures,
                                None if entry.until is None else to_wall(entry.until)]
                               for (host, index), entry
                               in state.hosts.slot_blacklist_snapshot().items()],
        },
        "strikes": [[_slot(slot), record.count, record.cause]
                    for slot, record in state.strikes.items()],
    }


def decode(body: dict[str, Any], hosts: HostRegistry, now: float, wall: float) -> JobState:
    """The state a journal body describes, in a new driver whose monotonic `now` is wall-clock
    `wall`; `hosts` (the new driver's, with its cooldown policy) takes back the hosts.
    ValueError (one line) when the body is not one this version wrote."""
    if body.get("version") != VERSION:
        raise ValueError(f"journal body version {body.get('version')!r}, expected {VERSION}")

    def to_now(moment: float) -> float:
        return moment - wall + now

    try:
        kept = body["hosts"]
        hosts.restore(
            {str(host): int(slots) for host, slots in kept["discovered"]},
            {str(host): BlacklistEntry(int(entry["failures"]),
                                       None if entry["until"] is None
                                       else to_now(float(entry["until"])))
             for host, entry in kept["blacklist"].items()},
            {str(host) for host in kept["drained"]},
            {(str(host), int(index)): BlacklistEntry(int(failures), None if until is None
                                                     else to_now(float(until)))
             for host, index, failures, until in kept.get("slot_blacklist", [])})
        workers = {}
        for w in body["workers"]:
            record = WorkerRecord(str(w["id"]), _slot_id(w["slot"]), int(w["rank"]),
                                  standby=bool(w["standby"]),
                                  status=WorkerStatus(w["status"]), alive=bool(w["alive"]),
                                  joined_round=int(w["joined_round"]),
                                  synced_round=int(w["synced_round"]),
                                  checked_in=bool(w["checked_in"]),
                                  started_at=None if w.get("started_at") is None
                                  else to_now(float(w["started_at"])))
            workers[record.id] = record
        kept_round = body["round"]
        round_ = None if kept_round is None else Round(
            number=int(kept_round["number"]),
            assignment={_slot_id(slot): SlotInfo.from_json(info)
                        for slot, info in kept_round["assignment"]},
            members={_slot_id(slot): str(worker) for slot, worker in kept_round["members"]},
            notice_seq=int(kept_round["notice_seq"]),
            opened_at=to_now(float(kept_round["opened_at"])),
            joined=set(kept_round["joined"]), synced=set(kept_round["synced"]),
            complete=bool(kept_round["complete"]), settled=bool(kept_round["settled"]),
            worker_lost=bool(kept_round.get("worker_lost", kept_round.get("host_failed"))))
        return JobState(hosts=hosts, phase=JobPhase(body["phase"]), workers=workers,
                        round=round_, notice_seq=int(body["notice_seq"]),
                        broken_round=int(body["broken_round"]),
                        state_committed=bool(body["state_committed"]),
                        probe_seq=int(body["probe_seq"]),
                        elastic_scripts=bool(body.get("elastic_scripts", True)),
                        restarts=int(body.get("restarts", 0)),
                        trained=bool(body.get("trained", True)),
                        strikes={_slot_id(slot): Strikes(int(count), str(cause))
                                 for slot, count, cause in body.get("strikes", [])})
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"journal body does not describe a job ({type(exc).__name__}: "
                         f"{exc})") from exc
