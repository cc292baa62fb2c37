"""What Horovod Elastic does around a script, as Horovod's own elastic integration tests see
it: the worker environment (HOROVOD_RANK at spawn), the host-change notices in
`state._host_messages`, hosts lost below --min-np, a failing rank. The script is written
in the style of Horovod's test script, with only the import changed."""

from __future__ import annotations

from pathlib import Path

from tests.integration import horovod_style
from tests.integration.harness import JobResult, run_job, write_script


def assert_ok(result: JobResult) -> None:
    assert result.returncode == 0, f"job failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def view(records: list[dict], *keys: str) -> list[tuple]:
    return [tuple(record[key] for key in keys) for record in records]


def test_hosts_added_and_removed(tmp_path: Path) -> None:
    """Horovod's test_hosts_added_and_removed (its 2-slot case; the 1-slot shape, hosts
    replaced at every epoch, runs in test_job_end): localhost, then both hosts, then only
    127.0.0.1. Rank 0 waits for each host change through `state._host_messages` (after
    resetting `state._last_updated_timestamp`, as that script does)."""
    slots = 2
    schedule: horovod_style.Schedule = [
        (0, [f"localhost:{slots}"]),
        (1, [f"localhost:{slots}", f"127.0.0.1:{slots}"]),
        (None, [f"127.0.0.1:{slots}"]),
    ]
    # The notice of an addition comes once the new workers have started, which takes a
    # few seconds here (Horovod's test waits 3 s: it notifies first and starts them later).
    result, records = horovod_style.run(tmp_path, schedule, np=slots, min_np=slots,
                                        max_np=2 * slots, script_args=["--discovery-wait", "20"])
    assert_ok(result)
    assert view(records, "epoch", "hostname", "start_rank", "size", "rendezvous") == [
        (0, "localhost", 0, slots, 1),
        (1, "localhost", 0, 2 * slots, 2),
        # Rank 0 is now the worker that started as rank `slots` on 127.0.0.1:
        # HOROVOD_RANK keeps the rank it was spawned with.
        (2, "127.0.0.1", slots, slots, 3),
    ]


def test_single_rank_failure(tmp_path: Path) -> None:
    """Horovod's test_single_rank_failure (exit by exception; a SIGKILLed rank is covered by
    test_elastic): start rank 0 fails at epoch 1, batch 0. Horovod blacklists its host and
    finishes on the other one; elasticrun keeps the host: the three others go on, rank 0 now
    being start rank 1 (HOROVOD_RANK at spawn), and the slot's new worker joins them."""
    schedule: horovod_style.Schedule = [(None, ["localhost:2", "127.0.0.1:2"])]
    result, records = horovod_style.run(tmp_path, schedule, np=2, min_np=2, max_np=4,
                                        exit_schedule={"(1, 0)": [0]})
    assert_ok(result)
    seen = view(records, "start_rank", "size", "rendezvous")
    assert seen[:2] == [(0, 4, 1), (1, 3, 2)], seen
    assert all(size in (3, 4) for _, size, _ in seen[2:]), seen
    assert "slot localhost[0] gets a new worker" in result.stderr
    assert "blacklisted" not in result.stderr


def test_hosts_lost_below_min_np_stop_training_and_the_job_fails_after_the_wait(
        tmp_path: Path) -> None:
    """Discovery lists no host after epoch 0. The workers are told (rank 0's wait for the
    notice succeeds), stop at their next commit, and the job waits --elastic-timeout for
    --min-np slots, then fails with one line naming --min-np, the slots and the wait."""
    schedule: horovod_style.Schedule = [(0, ["localhost:1", "127.0.0.1:1"]), (None, [])]
    result, records = horovod_style.run(
        tmp_path, schedule, np=2, min_np=2, max_np=2, flags=["--elastic-timeout", "3"],
        script_args=["--discovery-wait", "20", "--epochs", "5"])
    assert result.returncode != 0
    assert view(records, "epoch", "size") == [(0, 2)]  # no training after the hosts left
    assert "TimeoutError" not in result.stderr  # the notice came
    assert "0 slot(s) available, fewer than --min-np 2" in result.stderr
    assert result.error_lines() == [
        "elasticrun: error: elastic timeout: waited 3s (--elastic-timeout) for --min-np 2 "
        "slot(s), but only 0 are available (hosts: none)"]


def test_below_min_np_a_host_that_returns_within_the_wait_is_used(tmp_path: Path) -> None:
    """After epoch 0 discovery lists one of the two hosts for 3 s, then both again: the
    job waits (no training below --min-np), and the returning host's worker, kept alive
    with its state, rejoins: the same two processes finish the job."""
    logfile = tmp_path / "epochs.jsonl"
    since = tmp_path / "short-since"
    hosts = write_script(tmp_path / "hosts.sh", f"""
echo localhost:1
if [ -s {logfile} ]; then
  [ -f {since} ] || date +%s > {since}
  if [ $(( $(date +%s) - $(cat {since}) )) -ge 3 ]; then echo 127.0.0.1:1; fi
else
  echo 127.0.0.1:1
fi
""")
    args, _ = horovod_style.command(tmp_path, [(None, [])], np=2, min_np=2, max_np=2,
                                    flags=["--elastic-timeout", "60"],
                                    script_args=["--discovery-wait", "0", "--epochs", "3",
                                                 "--epoch-wait", "1"])
    args[args.index("--host-discovery-script") + 1] = str(hosts)
    result = run_job(args, timeout=120)
    assert_ok(result)
    records = horovod_style.read_records(logfile)
    assert view(records, "epoch", "size", "rendezvous") == [(0, 2, 1), (1, 2, 2), (2, 2, 2)]
    assert "1 slot(s) available, fewer than --min-np 2" in result.stderr
    assert "new worker" not in result.stderr  # nobody was started again: state kept
