"""Pure: a resumed driver takes its workers back.

The journal gave the machine its state (its phase, workers, round and hosts). The driver
serves again at a newer epoch, and the workers that come back (their agent reconnects and
says it still runs them) are counted; readoption.decide says what happens, as they come and
when the bound passes:
- every member of the kept round is back: the round goes on where it was (no rollback, no
  restart, the same processes);
- members missing at the bound: each is failed as a lost worker is (its host fails, the
  round breaks, the others roll back to their commit), and the usual recovery runs;
- the round was still forming when the old driver died: its members retry their joins
  against this driver, and if those complete it before who is back is decided, it goes
  on as above; otherwise, once every live worker is back (or at the bound), it is broken
  and a fresh one is cut with the workers that came back.
Workers kept that are not members (standbys that were starting) and did not come back are
forgotten. Discovery's answers are held meanwhile, and after, until one lists every host a
live member runs on (or the bound passes): when the driver starts no agent has reconnected,
and agents come back one by one; a list without them must not read as their hosts leaving.
"""

from __future__ import annotations

from collections import deque

from elasticrun.driver.rounds import cutting
from elasticrun.driver.rounds.actions import TimerKind
from elasticrun.driver.rounds.events import JobResumed
from elasticrun.driver.rounds.readoption import FailMissing, FreshRound, Readopt, Refuse, decide
from elasticrun.driver.rounds.state import JobPhase, JobState, Resume, WorkerStatus
from elasticrun.driver.rounds.step import Step


def started(step: Step, event: JobResumed) -> dict[str, int] | None:
    state = step.state
    expected = _kept(state)
    lost = set(event.lost) & expected
    members = state.round.member_ids if state.round is not None else set()
    state.resume = Resume(event.epoch, step.now, len(expected), lost=lost,
                          awaited=deque(sorted(expected - lost)),
                          members_awaited=set(members))
    step.timer(TimerKind.RESUME_BOUND, step.now + event.bound_s)
    step.log("info", f"driver restarted (epoch {event.epoch}): waiting up to "
                     f"{event.bound_s:g}s for {len(expected)} worker(s) to come back")
    return _evaluate(step, bound_passed=False)


def takes_back(state: JobState, worker_id: str, host: str) -> bool:
    """Whether the resumed driver takes `worker_id`, run on `host`, back (it is one the
    journal kept there, alive, and not back yet, and who is back is not settled yet)."""
    worker = state.workers.get(worker_id)
    return state.resume is not None and not state.resume.decided and worker is not None \
        and worker.alive \
        and worker.status is WorkerStatus.RUNNING and worker.slot.host == host \
        and worker_id not in state.resume.back


def back(step: Step, worker_id: str) -> dict[str, int] | None:
    resume = step.state.resume
    if resume is None or resume.decided or not _is_kept(step.state, worker_id):
        return None
    resume.back.add(worker_id)
    resume.members_awaited.discard(worker_id)
    # Only these can settle it before the bound: every member back (the round goes on), or
    # every worker that can come back (nothing to wait for). Else nothing to decide yet.
    if resume.members_awaited and not _all_back(step.state, resume):
        return None
    return _evaluate(step, bound_passed=False)


def bound_passed(step: Step) -> dict[str, int] | None:
    resume = step.state.resume
    if resume is None:
        return None
    if not resume.decided:
        return _evaluate(step, bound_passed=True)
    return _release(step, bound_passed=True)


def hosts_found(step: Step, hosts: dict[str, int]) -> dict[str, int] | None:
    """While resuming, discovery's answer is held; returns it, to be applied, once it
    agrees with the workers taken back."""
    resume = step.state.resume
    assert resume is not None
    resume.hosts = dict(hosts)
    return _release(step, bound_passed=False)


def _release(step: Step, bound_passed: bool) -> dict[str, int] | None:
    """Ends the resume once decided and discovery lists every live member's host (or at the
    bound); returns discovery's held answer, to be applied then."""
    state = step.state
    resume = state.resume
    if resume is None or not resume.decided:
        return None
    members = state.round.member_ids if state.round is not None else set()
    needed = {w.slot.host for w in state.workers.values() if w.alive and w.id in members}
    if not bound_passed and (resume.hosts is None or not needed <= set(resume.hosts)):
        return None
    state.resume = None
    return resume.hosts


def _kept(state: JobState) -> set[str]:
    return {w.id for w in state.workers.values()
            if w.alive and w.status is WorkerStatus.RUNNING}


def _is_kept(state: JobState, worker_id: str) -> bool:
    worker = state.workers.get(worker_id)
    return worker is not None and worker.alive and worker.status is WorkerStatus.RUNNING


def _all_back(state: JobState, resume: Resume) -> bool:
    """Whether every kept worker that can come back has (those not back yet have died
    meanwhile: a failure while the driver waited). Amortized O(1): each one is dropped from
    the queue once it is back or dead, and the first one still awaited ends the look."""
    queue = resume.awaited
    while queue:
        if queue[0] not in resume.back and _is_kept(state, queue[0]):
            return False
        queue.popleft()
    return True


def _evaluate(step: Step, bound_passed: bool) -> dict[str, int] | None:
    """Decides once it can; returns discovery's held answer then (to be applied), else
    None."""
    state = step.state
    resume = state.resume
    assert resume is not None
    number = state.round_number
    # Once every worker that can come back has, waiting longer gains nothing.
    waited = bound_passed or _all_back(state, resume)
    decision = decide(state, {worker: number for worker in resume.back}, waited)
    if isinstance(decision, Refuse):
        step.fail(decision.reason)
        return None
    if not isinstance(decision, (Readopt, FailMissing, FreshRound)):
        return None  # wait for more
    resume.decided = True
    members = state.round.member_ids if state.round is not None else set()
    for worker in state.workers.values():  # standbys that were starting, never back
        if worker.alive and worker.id not in resume.back and worker.id not in members:
            worker.alive = False
            worker.status = WorkerStatus.RELEASED
    seconds = step.now - resume.started
    step.log("info", f"driver restarted (epoch {resume.epoch}): re-adopted "
                     f"{len(resume.back)} of {resume.expected} worker(s) in {seconds:.1f}s")
    step.report("driver_resumed", epoch=resume.epoch, readopted=len(resume.back),
                expected=resume.expected, seconds=seconds)
    if isinstance(decision, FailMissing):
        for worker_id in decision.missing:
            worker = state.workers[worker_id]
            if not worker.alive:
                continue  # its exit, reported while the driver waited, failed it already
            worker.alive = False
            worker.status = WorkerStatus.FAILED
            cause = (f"rank {worker.rank} on host {worker.slot.host} ended with the old "
                     f"driver (its launcher does not outlive it)" if worker_id in resume.lost
                     else f"rank {worker.rank} on host {worker.slot.host} did not come back "
                          f"to the restarted driver")
            step.record_failure(worker, cause, "lost", rank=worker.rank)
            step.fail_host(worker.slot.host, cause)
    elif isinstance(decision, FreshRound):
        step.log("info", f"a fresh round is cut: {decision.why}")
        for worker_id in list(members - resume.back):
            state.workers[worker_id].alive = False
            state.workers[worker_id].status = WorkerStatus.RELEASED
        if state.round is None:  # the old driver died before its first round
            state.phase = JobPhase.STARTING
            step.timer(TimerKind.START_DEADLINE, step.now + step.config.start_timeout)
            cutting.try_start(step, waited_out=False)
        else:
            step.break_round(number)
            state.phase = JobPhase.RECOVERING
            cutting.cut(step)
    if state.phase is JobPhase.RECOVERING and (state.cut_at is None
                                               or state.cut_at <= step.now):
        cutting.cut(step)  # the cut a failure asked for while the driver waited
    return _release(step, bound_passed)
