"""Pure: a worker asking for its place — run, wait, or leave — and what its asking means.

A join is held (the worker's long-poll waits) until the machine can answer it; held joins
are answered when something they wait for changes: a round opens or completes, a round
settles, or the time a leaving worker is kept runs out.
"""

from __future__ import annotations

from elasticrun.driver.rounds import growth, slot_failures
from elasticrun.driver.rounds.actions import StopWorkers, TimerKind
from elasticrun.driver.rounds.events import JoinAsked
from elasticrun.driver.rounds.state import JobPhase, ResetRequest, WorkerRecord, WorkerStatus
from elasticrun.driver.rounds.step import Step
from elasticrun.protocol import JoinReply

# A worker asked for a new round because its collective failed, but the driver has seen no
# failure: the exit that explains it is usually on its way. Waiting this long for it lets the
# next round be cut once, without the failed host, instead of twice.
UNEXPLAINED_RESET_WAIT_S = 0.5
# A running member rejoins as soon as its collective fails, which takes at most the
# collective timeout; one that has not rejoined this long after that is stuck.
REJOIN_SLACK_S = 5.0
# A round its members have not all joined, built and synced this long after its first join:
# the laggards' hosts are asked what their processes do (liveness.forming_due).
FORMING_FIRST_S = 1.0


def asked(step: Step, event: JoinAsked) -> None:
    worker = step.state.workers.get(event.worker)
    if worker is None or not worker.alive:
        step.answer(event.worker, JoinReply("exit", reason="this worker was stopped"))
        return
    step.state.elastic_scripts = True  # its script calls er.init(): no restart mode
    step.state.waiting_joins[worker.id] = event.last_round
    evaluate(step, worker, event.last_round)
    current = step.state.round
    if worker.id in step.state.waiting_joins and current is not None \
            and current.number <= event.last_round:
        reset_requested(step, worker, event)


def evaluate(step: Step, worker: WorkerRecord, last_round: int) -> None:
    """Answers a held join if it can be answered now; otherwise it stays held."""
    state = step.state
    current = state.round
    if current is None or current.number <= last_round:
        return  # no round for it yet
    if current.members.get(worker.slot) != worker.id:
        _not_a_member(step, worker)
        return
    if worker.id not in current.joined:
        current.joined.add(worker.id)
        if len(current.joined) == 1:
            _barrier_started(step)
        if len(current.joined) == len(current.member_ids):
            current.complete = True
            step.report("round_completed", number=current.number)
            for member in [w for w in current.member_ids if w in state.waiting_joins]:
                if member != worker.id:
                    _admit(step, state.workers[member])
    if current.complete:
        _admit(step, worker)


def reevaluate(step: Step) -> None:
    """Answers every held join that can be answered now."""
    state = step.state
    for worker_id, last_round in list(state.waiting_joins.items()):
        worker = state.workers.get(worker_id)
        if worker is None or not worker.alive:
            state.waiting_joins.pop(worker_id, None)
        else:
            evaluate(step, worker, last_round)


def _admit(step: Step, worker: WorkerRecord) -> None:
    current = step.state.round
    assert current is not None
    info = current.assignment[worker.slot]
    worker.rank = info.rank
    worker.joined_round = current.number
    step.answer(worker.id, JoinReply("run", round=current.number, slot=info,
                                  notice_seq=current.notice_seq))


def _not_a_member(step: Step, worker: WorkerRecord) -> None:
    """A worker with no place in the current round leaves, unless it is a standby (it waits
    for the next round) or it may still be needed to hand the committed state over: it is
    kept until the round settles, or for at most the hold time."""
    current = step.state.round
    assert current is not None
    hold_until = current.opened_at + step.config.start_timeout + step.config.collective_timeout
    if not worker.standby and (current.settled or step.now >= hold_until):
        if worker.status is WorkerStatus.RUNNING:
            worker.status = WorkerStatus.RELEASED
            step.log("info", f"worker {worker.slot} has no place in round {current.number}; "
                             f"it exits")
        step.answer(worker.id, JoinReply("exit", round=current.number,
                                      reason="no place in the new round"))
        return
    if worker.standby:
        growth.checked_in(step, worker)
    elif step.state.hold_timer_round != current.number:
        step.state.hold_timer_round = current.number
        step.timer(TimerKind.HOLD_LEAVING, hold_until, round=current.number)


def _barrier_started(step: Step) -> None:
    """A round's first join: its other members are given their bounds from now on. One
    that never joined before gets --init-timeout (its imports, data and model come first);
    one that ran in an earlier round rejoins as soon as its collective fails."""
    current = step.state.round
    assert current is not None
    step.timer(TimerKind.CHECK_IN, step.now + step.config.init_timeout, round=current.number)
    step.timer(TimerKind.REJOIN, step.now + rejoin_bound(step), round=current.number)
    if step.config.hang_detection:
        step.timer(TimerKind.FORMING, step.now + FORMING_FIRST_S, round=current.number)


def opened(step: Step) -> None:
    """A round just opened. Its check-in deadlines start at its first join; should none of
    its members that ran before ever join (all held elsewhere, e.g. in a build Gloo cannot
    abort), they are bounded too. Members that never joined anything have no bound until a
    first member joins: a script that never calls er.init() runs as long as it runs."""
    state = step.state
    current = state.round
    assert current is not None
    if any((w := state.workers.get(m)) is not None and w.joined_round > 0
           for m in current.member_ids):
        step.timer(TimerKind.UNJOINED, step.now + unjoined_bound(step), round=current.number)


def rejoin_bound(step: Step) -> float:
    return step.config.collective_timeout + REJOIN_SLACK_S


def unjoined_bound(step: Step) -> float:
    return step.config.start_timeout + rejoin_bound(step)


def nobody_joined(step: Step, number: int) -> None:
    """Round `number` has had no join since it opened, for the whole bound: every member
    that ran in an earlier round is failed (and its host)."""
    current = step.state.round
    if current is not None and current.number == number and not current.joined:
        _fail_missing(step, number, survivors=True,
                      within=f"{unjoined_bound(step):g}s of its opening (no member joined)")


def check_in_expired(step: Step, number: int, survivors: bool) -> None:
    """Members of round `number` that have not joined in time are failed (and their hosts):
    those that ran in an earlier round (`survivors`, the rejoin bound), or those that never
    joined anything (--init-timeout)."""
    if survivors:
        _fail_missing(step, number, True, within=f"{rejoin_bound(step):g}s")
    else:
        _fail_missing(step, number, False, within=f"{step.config.init_timeout:g}s of its "
                                                  f"round's first join (--init-timeout)")


def _fail_missing(step: Step, number: int, survivors: bool, within: str) -> None:
    state = step.state
    current = state.round
    if step.stopped or current is None or current.number != number or current.complete:
        return
    for slot in current.missing():
        worker = state.workers.get(current.members[slot])
        if worker is None or not worker.alive or worker.status is not WorkerStatus.RUNNING:
            continue
        if survivors != (worker.joined_round > 0):
            continue  # the other bound applies to it
        rank = current.assignment[slot].rank
        did = "did not join" if survivors else "did not call er.init() for"
        cause = f"rank {rank} on host {slot.host} {did} round {number} within {within}"
        step.record_failure(worker, cause, "check_in_timeout", rank=rank)
        worker.status = WorkerStatus.FAILED
        step.emit(StopWorkers((worker.id,), kill=True))
        slot_failures.failed(step, worker, cause)


def reset_requested(step: Step, worker: WorkerRecord, event: JoinAsked) -> None:
    """A member of the current round asks for the next one."""
    state = step.state
    current = state.round
    if state.phase is JobPhase.FINISHING or current is None \
            or not state.is_member(worker.id) or worker.id in state.resets:
        return
    state.resets[worker.id] = ResetRequest(worker.id, worker.rank, worker.slot.host,
                                           event.failure, event.committed)
    if event.failure:  # it left the round on a failure: its peers' collectives cannot finish
        step.break_round(current.number)
    expected = state.notice_seq > current.notice_seq  # a host change was announced
    if expected or len(state.resets) >= len(current.member_ids):
        step.request_cut(0.0)
    else:
        step.request_cut(UNEXPLAINED_RESET_WAIT_S)


def synced(step: Step, worker_id: str, number: int) -> None:
    """A worker holds round `number`'s committed state now."""
    state = step.state
    worker = state.workers.get(worker_id)
    if worker is None or not worker.alive:
        return
    worker.synced_round = max(worker.synced_round, number)
    state.state_committed = True
    current = state.round
    if current is None or current.number != number or current.settled \
            or worker_id not in current.member_ids:
        return
    current.synced.add(worker_id)
    if len(current.synced) == len(current.member_ids):
        current.settled = True  # leaving workers are not needed any more
        state.failed_unsettled.clear()
        reevaluate(step)
        growth.plan(step)
