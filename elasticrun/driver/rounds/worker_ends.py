"""Pure: a worker's end, as the round machine takes it — its exit, its own error, a hang,
a spawn that failed.

Each marks the worker, forgets what waited on it, and has its failure judged: its round
restarted (restarts.py), its slot blamed (slot_failures.py), or the job ended. Once a worker
is gone, what waited for it goes on (`after_exit`).
"""

from __future__ import annotations

from elasticrun.driver.rounds import cutting, growth, restarts, slot_failures, stragglers
from elasticrun.driver.rounds.actions import StopWorkers
from elasticrun.driver.rounds.events import SpawnFailed, WorkerExited, WorkerFailing
from elasticrun.driver.rounds.exits import describe_exit, exit_kind
from elasticrun.driver.rounds.liveness import Verdict
from elasticrun.driver.rounds.state import JobPhase, WorkerRecord, WorkerStatus
from elasticrun.driver.rounds.step import Step


def spawn_failed(step: Step, event: SpawnFailed) -> None:
    worker = step.state.workers.get(event.worker)
    if worker is None:
        return
    worker.alive = False
    worker.status = WorkerStatus.FAILED
    _forget(step, worker.id)
    cause = f"{event.error} (on host {worker.slot.host})"
    step.record_failure(worker, cause, "spawn_error", rank=None)
    if restarts.applies(step.state, worker):
        restarts.failed(step, cause, "spawn_error")
    step.fail_host(worker.slot.host, event.error)


def after_exit(step: Step, gone: WorkerRecord | None = None) -> None:
    """A worker is gone: the new worker waiting for its slot starts, a restart waiting for
    its round's members may go on, and so may a cut waiting for sync reports (with no worker
    alive, none can come). A failed standby's slot gets a new one (a member's: at the cut)."""
    state = step.state
    if step.stopped:
        return
    slot_failures.vacated(step)
    waiting_for_reports = state.sync_grace_until is not None
    if restarts.all_gone(state, step.now) or state.unrecoverable is not None or (
            waiting_for_reports and not any(w.alive for w in state.workers.values())):
        cutting.cut(step)
    if gone is not None and gone.status is WorkerStatus.FAILED and not state.is_member(gone.id):
        state.workers.pop(gone.id, None)  # nothing refers to it any more (a cut may have
        growth.plan(step)  # forgotten it already); its slot gets a new standby


def exited(step: Step, event: WorkerExited) -> WorkerRecord | None:
    """Returns the worker that is gone (None: unknown, or gone already)."""
    state = step.state
    worker = state.workers.get(event.worker)
    if worker is None or not worker.alive:
        return None
    worker.alive = False
    _forget(step, worker.id)
    code = event.code
    if worker.status is WorkerStatus.FAILED:
        step.log("debug", f"worker {worker.slot} ended after its own error "
                          f"({describe_exit(code)})")
        return worker
    if worker.status in (WorkerStatus.RELEASED, WorkerStatus.STOPPING):
        step.log("debug", f"worker {worker.slot} ended after being stopped or released "
                          f"({describe_exit(code)})")
        if worker.status is WorkerStatus.STOPPING:
            restarts.died_while_stopping(step, worker, code)
        _finish_if_done(step)
        return worker
    if code == 0:
        worker.status = WorkerStatus.FINISHED
        if state.is_member(worker.id):
            state.phase = JobPhase.FINISHING
        _finish_if_done(step)
        return worker
    worker.status = WorkerStatus.FAILED
    if event.host_lost and restarts.applies(state, worker):
        restarts.lost_with_host(step, worker, code)
        return worker
    cause = f"rank {worker.rank} on host {worker.slot.host} {describe_exit(code)}"
    step.record_failure(worker, cause, exit_kind(code), rank=worker.rank, exit_code=code)
    if event.host_lost:  # its agent went away: the host is lost, not only this worker
        step.fail_host(worker.slot.host, f"{cause} with its host's agent")
    else:
        _failed(step, worker, cause, exit_kind(code))
    return worker


def failing(step: Step, event: WorkerFailing) -> None:
    """Its own error ends a worker: the same as its failed exit, but known before it is
    through its teardown, so its round breaks now. It is left to print its error and exit
    (it is not stopped: a signal could cut its traceback off)."""
    worker = step.state.workers.get(event.worker)
    if worker is None or not worker.alive or worker.status is not WorkerStatus.RUNNING:
        return
    worker.status = WorkerStatus.FAILED
    _forget(step, worker.id)
    cause = f"rank {worker.rank} on host {worker.slot.host} failed: {event.failure}"
    step.record_failure(worker, cause, "exception", rank=worker.rank)
    if event.unrecoverable and step.state.unrecoverable is None:
        step.state.unrecoverable = (worker.id, cause)  # a restart would fail the same way
    _failed(step, worker, cause, "exception")


def hung(step: Step, verdicts: list[Verdict]) -> None:
    """Hung workers are killed at once (one that woke up later must not act in a later
    round) and fail as a failed exit does. A host that does not answer fails too: it can
    neither be stopped nor used."""
    for verdict in verdicts:
        worker = verdict.worker
        if not worker.alive or worker.status is not WorkerStatus.RUNNING:
            continue
        worker.status = WorkerStatus.FAILED
        _forget(step, worker.id)
        step.state.stall = None
        step.emit(StopWorkers((worker.id,), kill=True))
        cause = f"rank {worker.rank} on host {worker.slot.host} hung: {verdict.reason}"
        step.record_failure(worker, cause, "hang", rank=worker.rank)
        _failed(step, worker, cause, "hang")
        if verdict.unreachable:
            step.fail_host(worker.slot.host, cause)


def _failed(step: Step, worker: WorkerRecord, cause: str, kind: str) -> None:
    if restarts.applies(step.state, worker):
        restarts.failed(step, cause, kind)
        slot_failures.blame(step, worker, cause)
    elif step.state.phase is JobPhase.FINISHING:
        step.fail(f"{cause} after other workers had finished")
    else:
        slot_failures.failed(step, worker, cause)


def _forget(step: Step, worker_id: str) -> None:
    state = step.state
    state.waiting_joins.pop(worker_id, None)
    state.growth.ids.discard(worker_id)
    state.growth.ready.discard(worker_id)
    stragglers.forget(step, worker_id)


def _finish_if_done(step: Step) -> None:
    current = step.state.round
    if current is None or not current.member_ids:
        return
    workers = step.state.workers
    if all((w := workers.get(wid)) is not None and w.status is WorkerStatus.FINISHED
           for wid in current.member_ids):
        step.log("info", f"all {len(current.member_ids)} worker(s) of round "
                         f"{current.number} finished")
        step.finish(0)
