"""The round machine's state as a journal body and back: what a resumed driver keeps."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from elasticrun.driver.hosts.registry import HostRegistry
from elasticrun.driver.journal.codec import decode, encode
from elasticrun.driver.rounds import events as ev
from elasticrun.driver.rounds.state import JobState
from tests.unit.machine_sim import Sim, config

WALL = 1_790_000_000.0  # the wall clock when the journal was written (at the Sim's `now`)
LATER = 30.0  # seconds of wall clock until a new driver reads it
NEW_NOW = 5.0  # the new driver's monotonic clock then


def recovered_job() -> Sim:
    """Round 1 on a (2) and b (2), b lost with its agent: b blacklisted with a cooldown,
    round 2 on a alone, joined and synced; a[1]'s worker then fails 3 times in a row (its
    slot blacklisted, its failures counted); then host c found (discovered, not yet used)."""
    sim = Sim(config(np=2, min_np=1, max_np=6, blacklist_cooldown=(10.0, 100.0)))
    sim.running({"a": 2, "b": 2})
    sim.send(ev.WorkerExited(sim.worker_on("b", 1).id, -9, host_lost=True))
    sim.advance(1.0)
    sim.join_all()
    sim.sync_all()
    for _ in range(3):
        sim.send(ev.WorkerExited(sim.worker_on("a", 1).id, 1))
        sim.started(sim.advance(1.0))
    sim.join_all()
    sim.sync_all()
    sim.send(ev.HostsFound({"a": 2, "b": 2, "c": 1}))
    return sim


def read_back(state: JobState, now: float) -> JobState:
    body = json.loads(json.dumps(encode(state, now, WALL)))  # as the file holds it
    return decode(body, HostRegistry((10.0, 100.0), random.Random(0)), NEW_NOW,
                  WALL + LATER)


def test_the_state_a_resumed_driver_needs_reads_back_equal() -> None:
    sim = recovered_job()
    state = sim.state
    assert state.round_number > 2 and state.hosts.blacklist_snapshot()  # the scenario
    assert state.hosts.slot_blacklist_snapshot() and state.strikes
    kept = read_back(state, sim.now)
    assert kept.phase is state.phase and kept.round_number == state.round_number
    assert kept.strikes == state.strikes
    # slots, ranks, status, joined and synced rounds; start times on the new clock
    assert {w: replace(r, started_at=None) for w, r in kept.workers.items()} == \
        {w: replace(r, started_at=None) for w, r in state.workers.items()}
    for worker_id, record in state.workers.items():
        started = kept.workers[worker_id].started_at
        assert (started is None) == (record.started_at is None)
        if started is not None and record.started_at is not None:
            assert started - NEW_NOW == pytest.approx(record.started_at - sim.now - LATER)
    assert kept.round is not None and state.round is not None
    assert kept.round.assignment == state.round.assignment
    assert kept.round.members == state.round.members
    assert (kept.round.joined, kept.round.synced) == (state.round.joined, state.round.synced)
    assert (kept.round.complete, kept.round.settled) == (True, True)
    assert (kept.notice_seq, kept.broken_round, kept.state_committed, kept.probe_seq) == \
        (state.notice_seq, state.broken_round, state.state_committed, state.probe_seq)
    assert kept.hosts.discovered == state.hosts.discovered == {"a": 2, "b": 2, "c": 1}
    assert kept.hosts.drained == state.hosts.drained


def test_times_are_carried_across_clocks_as_wall_clock() -> None:
    """A blacklisted host's cooldown and the round's age go on where they were, on the new
    driver's monotonic clock, less the time the driver was away."""
    sim = recovered_job()
    kept = read_back(sim.state, sim.now)
    [(host, before)] = sim.state.hosts.blacklist_snapshot().items()
    after = kept.hosts.blacklist_snapshot()[host]
    assert before.until is not None and after.until is not None
    assert after.failures == before.failures
    assert after.until - NEW_NOW == pytest.approx(before.until - sim.now - LATER)
    [(slot, before)] = sim.state.hosts.slot_blacklist_snapshot().items()
    after = kept.hosts.slot_blacklist_snapshot()[slot]
    assert slot == ("a", 1) and before.until is not None and after.until is not None
    assert after.until - NEW_NOW == pytest.approx(before.until - sim.now - LATER)
    assert kept.round is not None and sim.state.round is not None
    assert NEW_NOW - kept.round.opened_at == pytest.approx(
        sim.now - sim.state.round.opened_at + LATER)


def test_a_body_of_another_version_or_shape_is_refused_in_one_line() -> None:
    sim = recovered_job()
    body = encode(sim.state, sim.now, WALL)
    hosts = HostRegistry()
    with pytest.raises(ValueError, match="version 99, expected 1"):
        decode({**body, "version": 99}, hosts, NEW_NOW, WALL)
    broken = {**body, "workers": [{"id": "w"}]}
    with pytest.raises(ValueError) as refused:
        decode(broken, hosts, NEW_NOW, WALL)
    assert "\n" not in str(refused.value) and "does not describe a job" in str(refused.value)
