"""Chaos soak: a real job across local and SSH hosts survives random faults, losing nothing.
Among them a total loss, every worker SIGKILLed at once: the job goes on from a host snapshot.

CI runs a short soak (CHAOS_FAULTS, default 12). The long mode, by hand:
    CHAOS_FAULTS=100 CHAOS_SEED=7 python -m pytest tests/chaos -s
prints the summary line (faults by kind, duration, driver memory, recovery by kind);
CHAOS_HANG_DETECTION=0 runs it as before hang detection, for comparison;
CHAOS_DRIVER_RESTARTS=1 adds a fault: the driver SIGKILLed, and resumed (--state-dir,
`elasticrun --resume --state-dir DIR`) 0.2-2 s later.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.chaos.runner import MIN_NP, Chaos, ChaosReport, final_epoch
from tests.integration.harness import assert_no_orphans
from tests.integration.progress import RoundView, check_job
from tests.ssh.conftest import SSHServer

FAULTS = int(os.environ.get("CHAOS_FAULTS", "12"))
SEED = int(os.environ.get("CHAOS_SEED", "1"))
HANG_DETECTION = os.environ.get("CHAOS_HANG_DETECTION", "1") != "0"
DRIVER_RESTARTS = os.environ.get("CHAOS_DRIVER_RESTARTS", "0") == "1"
RSS_GROWTH_LIMIT_MIB = 16.0
RESTORED = re.compile(r"round (\d+): restored from the snapshot of commit \d+ \((.+?)\)")


@pytest.mark.timeout(max(300, 30 * FAULTS))
def test_chaos_soak(tmp_path: Path, sshd: SSHServer) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host sshchaos\n  HostName 127.0.0.1\n  Port {sshd.port}\n"
        f"  IdentityFile {sshd.client_key}\n")
    (home / ".ssh" / "known_hosts").write_text(sshd.known_hosts_line())
    chaos = Chaos(tmp_path / "job", SEED, ssh_hosts=["sshchaos"], extra_env={"HOME": str(home)},
                  hang_detection=HANG_DETECTION, driver_restarts=DRIVER_RESTARTS)
    try:
        report = chaos.run(FAULTS)
    finally:  # what the driver said, for whoever has to find out what went wrong
        print("\n" + "".join(chaos.report.stderr.splitlines(keepends=True)[-150:]))
    print("\n" + report.summary())
    assert report.returncode == 0, report.stderr[-4000:]
    assert_no_orphans(chaos.tag)

    assert len(report.injected) == FAULTS >= 10
    assert {"sigkill", "sigkill_all", "exception"} <= set(report.counts()), report.counts()
    epochs = final_epoch(report.records)
    views = check_job(report.records, samples=48, epochs=epochs)
    check_restores(report, {view.number: view for view in views})
    # A killed or failing worker always ends its round; other faults may not (discovery
    # trouble, a host added beyond --max-np), and faults close together share a new round.
    breaking = sum(report.counts()[kind] for kind in ("sigkill", "sigkill_all", "exception"))
    assert len(views) > breaking // 2, f"{breaking} failures, {len(views)} rounds"
    assert min(v.size for v in views) >= MIN_NP
    # Faults are not slowness: no member was named a straggler (--stragglers report)
    assert "is a straggler" not in report.stderr, report.stderr[-4000:]
    assert any("sshchaos" in v.hosts_by_rank.values() for v in views)
    # The driver does not grow with the rounds it went through (resets leave nothing behind).
    rss = report.driver_rss_kb
    assert (rss[-1] - min(rss[: max(1, len(rss) // 3)])) / 1024 < RSS_GROWTH_LIMIT_MIB, rss


def check_restores(report: ChaosReport, views: dict[int, RoundView]) -> None:
    """Each total loss was restored once, from a host snapshot of the last commit or the one
    before (the snapshot's writer runs a commit behind at most), model and optimizer alike.
    check_job has checked the rest: the round resumed from a committed state, every rank
    bitwise equal, every sample exactly once."""
    restores = RESTORED.findall(report.stderr)
    assert len(restores) == report.counts()["sigkill_all"], (restores, report.injected)
    for (number, source), lost_at in zip(restores, report.lost_at_step, strict=True):
        view = views[int(number)]
        assert source.startswith("host"), f"round {number} restored from {source}"
        # An epoch's end commits again at the same step: a commit behind is a step behind.
        assert view.resume_step >= lost_at - 1, f"lost at step {lost_at}, resumed at {view}"
        members = [r for r in report.records
                   if r["event"] == "round" and r["round"] == view.number]
        kept = {r["optimizer_hash"] for r in report.records if r["event"] == "step"
                and (r["step"], r["hash"]) == (view.resume_step, view.hash)}
        assert {r["optimizer_hash"] for r in members} <= kept, \
            f"round {number}: optimizer state not the committed one"
