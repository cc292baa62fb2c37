"""Pure: a total loss — every worker holding the committed state lost at once — is a restart.

Workers keep every commit outside their processes (a host snapshot in host memory, and
--checkpoint-dir: torch/elastic/keeper.py). So when no live worker holds the commit any more
(a job-wide error, the same bad batch on every rank, the OOM killer, a reclaimed spot pool),
the driver starts a new round with new workers in the slots the hosts offer, told to restore
(ENV_RESTORE): their first sync restores the newest complete kept commit (restoring.py).

The rules:
- The hosts (and slots) that the failures making the loss blacklisted (those since a
  round last settled: rounds opened meanwhile from workers not yet known dead count too)
  are given back for the restart (their count of failures kept): when every worker goes at
  once, no host is to blame in particular, and blacklisting them all would leave the job
  nowhere to go (on one machine, nothing). A host that really is broken fails the
  restarted round again.
- Such restarts count against --max-restarts, as restarts of a plain round do; with none
  left, the job ends, naming the failure: a failure that repeats on every rank after every
  restart ends the job after --max-restarts restarts.
- With nothing kept (--no-host-snapshots and no --checkpoint-dir), the job stops as before:
  a new round would train from scratch in silence.
- A restarted round that finds no kept commit, or one that does not fit the model, ends the
  job at once (its workers report an UnrecoverableStateError: worker_ends.py), rather than
  spending every restart on the same outcome.
"""

from __future__ import annotations

from elasticrun.driver.rounds.step import Step


def can_restore(step: Step) -> bool:
    config = step.config
    return config.host_snapshots or config.checkpoint_dir is not None


def restart(step: Step) -> bool:
    """The state was lost: True when the next round restarts from the kept commit (its cut
    goes on), False when the job ended."""
    state, config = step.state, step.config
    lost = state.round
    if lost is not None and lost.number == state.lost_round:
        return True  # counted at an earlier cut (one that waited for slots)
    cause = lost.first_failure if lost is not None and lost.first_failure else "unknown cause"
    if not can_restore(step):
        step.fail("no worker holding the committed training state is left (every one was "
                  f"lost; first: {cause}), and nothing keeps it outside them (host snapshots "
                  "are off and there is no --checkpoint-dir): a new round would silently "
                  "start training from scratch, so the job stops")
        return False
    if state.restarts >= config.max_restarts:
        step.fail(f"every worker holding the committed training state was lost, and no "
                  f"restart is left (--max-restarts {config.max_restarts}); first failure: "
                  f"{cause}")
        return False
    state.restarts += 1
    state.lost_round = lost.number if lost is not None else 0
    state.restoring = True
    state.storm.clear()
    failed = state.failed_unsettled | (lost.failed_hosts if lost else set())
    given_back = sorted(host for host in failed if state.hosts.holds_out(host, step.now))
    for host in given_back:
        state.hosts.give_back(host)
    hosts = f"; hosts given back: {', '.join(given_back)}" if given_back else ""
    step.log("warning", f"every worker holding the committed training state was lost "
                        f"(first: {cause}); restarting from the newest kept commit (restart "
                        f"{state.restarts} of {config.max_restarts}){hosts}")
    step.report("total_loss", cause=cause, restarts=state.restarts, hosts=given_back)
    return True


def restored(step: Step, number: int, commit: int, source: str) -> None:
    """A round's rank 0 restored a kept commit at its sync."""
    step.state.restoring = False
    step.log("info", f"round {number}: restored from the snapshot of commit {commit} "
                     f"({source})")
    step.report("state_restored", round=number, commit=commit, source=source)
