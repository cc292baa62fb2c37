"""Pure: restart mode — a round of scripts that never call er.init() is restarted whole.

A torchrun-style script (its own DDP loop, a Hugging Face or Lightning Trainer) keeps no
state elasticrun could roll back to: it trains on from its own checkpoints. When one of its
workers fails (exits non-zero, is killed, hangs), its round cannot go on without it, as
under torchrun: every member is stopped (SIGTERM, the grace period, SIGKILL of its process
group) and, once all are gone, the next round starts a new worker in every slot, its
TORCHELASTIC_RESTART_COUNT one higher. Such failures count against --max-restarts and do
not blacklist the host: a dead process says little about its machine, and a job on one
machine would have none left. A host that cannot start workers still fails. A change of
the hosts within the job's limits restarts the round too, without counting, as torchrun
restarts its workers when a node joins or leaves.

A job's rounds are plain until its script is known to call er.init(): one of its workers
calls it (its foothold says so) or asks to join, or, before any has run, the script's text
calls it (processes/script_kind.py; an import of elasticrun alone, an integration's or a
helper's, never decides). Such scripts keep in-process recovery (machine.py, cutting.py).
"""

from __future__ import annotations

from elasticrun.driver.rounds.events import TimerKind
from elasticrun.driver.rounds.exits import describe_exit, exit_kind, killed_from_outside
from elasticrun.driver.rounds.state import JobPhase, JobState, Restart, WorkerRecord
from elasticrun.driver.rounds.step import Step

# Beyond the grace period, how long a SIGKILLed member's exit may take to be reported (a
# worker whose host's template still imports torch answers its stop late); a member still
# not gone then is on a host that cannot be reached (restart_stopped).
STOP_SLACK_S = 15.0


def plain(state: JobState) -> bool:
    """Whether a round runs and the job's scripts never called er.init()."""
    return state.round is not None and not state.elastic_scripts


def applies(state: JobState, worker: WorkerRecord) -> bool:
    """Whether restart mode decides what `worker`'s failure does: a member of a plain
    round."""
    return plain(state) and state.is_member(worker.id)


def failed(step: Step, cause: str, kind: str) -> None:
    """A member of a plain round failed (`cause` names it, `kind` its exits.exit_kind or
    "exception", "hang", ...): every member is stopped. Whether it counts against
    --max-restarts is decided once they are gone (settle): when a node dies, the others'
    collectives fail too, often before its loss is known."""
    state = step.state
    if state.restart is None:
        step.log("info", f"{cause}; stopping every worker to restart them")
        _begin(step, cause, kind)


def died_while_stopping(step: Step, worker: WorkerRecord, code: int) -> None:
    """A member being stopped for a restart died of its own before the stop could kill it
    (SIGKILL within the grace period, a crash): that death, not a peer's error that only
    reported first, is the restart's cause. (A peer's failing collective reports at once;
    a killed rank's exit, from another node, comes through its agent.)"""
    restart = step.state.restart
    if restart is None or restart.settled or restart.kind != "exception" \
            or not killed_from_outside(code) \
            or step.now >= restart.began + step.config.stop_grace_period:
        return
    cause = f"rank {worker.rank} on host {worker.slot.host} {describe_exit(code)}"
    step.record_failure(worker, cause, exit_kind(code), rank=worker.rank, exit_code=code)
    step.log("info", f"{cause}: the cause of this restart")
    restart.cause, restart.kind = cause, exit_kind(code)


def lost_with_host(step: Step, worker: WorkerRecord, code: int) -> None:
    """A member of a plain round ended with its host (its agent went away: a node lost or
    preempted): the hosts changed, and the round restarts without counting."""
    host = worker.slot.host
    cause = f"rank {worker.rank} on host {host} was lost with its host"
    step.record_failure(worker, cause, "lost", rank=worker.rank, exit_code=code)
    if step.state.restart is None:
        _uncounted(step, f"host {host} is gone")
    else:
        step.state.restart.explained = True


def settle(step: Step) -> bool:
    """The old members are gone: a restart after a failure counts now, unless a host left
    meanwhile (its loss explains the failure). False: --max-restarts is spent, and the job
    ends instead (its workers are all stopped by then)."""
    state, config = step.state, step.config
    restart, current = state.restart, state.round
    if restart is None or restart.settled or not restart.cause or current is None:
        return True
    restart.settled = True
    discovered = state.hosts.discovered
    if restart.explained or any(slot.host not in discovered for slot in current.assignment):
        step.log("info", f"{restart.cause}: a host was lost meanwhile; the restart is not "
                         f"counted against --max-restarts")
        return True
    if state.restarts >= config.max_restarts:
        step.fail(_spent(restart.cause, config.max_restarts))
        return False
    state.restarts += 1
    step.log("warning", f"{restart.cause}; restarting every worker (restart {state.restarts} "
                        f"of --max-restarts {config.max_restarts}): the scripts never called "
                        f"er.init(), so they go on from their own checkpoints")
    step.report("round_restarting", count=state.restarts, cause=restart.cause)
    return True


def hold(step: Step) -> bool:
    """Whether the next round must wait for the current, plain one's members to be gone
    (a cut's first question). A cut asked for by a host change or a failed host begins an
    uncounted restart here."""
    state = step.state
    if state.restart is None:
        if not plain(state) or not _alive(state):
            return False
        _uncounted(step, "the hosts changed")
    return bool(_alive(state, step.now))


def all_gone(state: JobState, now: float) -> bool:
    """Whether a restart under way may open the next round now."""
    return state.restart is not None and not _alive(state, now)


def stop_deadline(step: Step) -> None:
    """The members still not gone at the deadline are on hosts that cannot be reached:
    those hosts fail, and the workers are given up (their exits, if any, come too late)."""
    state = step.state
    if state.restart is None or step.now < state.restart.deadline:
        return
    for worker in _alive(state):
        worker.alive = False
        step.fail_host(worker.slot.host, f"rank {worker.rank} on host {worker.slot.host} "
                                         f"did not stop within its grace period")


def _uncounted(step: Step, why: str) -> None:
    step.log("info", f"{why}: restarting every worker (not counted against --max-restarts)")
    step.report("round_restarting", count=step.state.restarts, cause="")
    _begin(step, "", "")


def _begin(step: Step, cause: str, kind: str) -> None:
    state = step.state
    current = state.round
    assert current is not None
    state.phase = JobPhase.RECOVERING
    state.stall = None
    deadline = step.now + step.config.stop_grace_period + STOP_SLACK_S
    state.restart = Restart(deadline, cause, kind, began=step.now)
    step.timer(TimerKind.RESTART_STOPPED, deadline, round=current.number)
    step.report("round_broken")
    step.break_round(current.number)
    step.stop_workers(_alive(state))
    step.request_cut(0.0)


def _alive(state: JobState, now: float | None = None) -> list[WorkerRecord]:
    """The round's members not gone yet; with `now`, only those on hosts still usable (a
    failed host's are given up: the next round does not use it)."""
    current = state.round
    if current is None:
        return []
    workers, hosts = state.workers, state.hosts
    return [w for m in current.member_ids if (w := workers.get(m)) is not None and w.alive
            and (now is None or not hosts.is_blacklisted(w.slot.host, now))]


def _spent(cause: str, max_restarts: int) -> str:
    if max_restarts == 0:
        return (f"{cause}; the workers never called er.init(), so they can only be restarted, "
                f"and --max-restarts is 0")
    return f"{cause}; --max-restarts {max_restarts} spent (restarted {max_restarts} time(s))"
