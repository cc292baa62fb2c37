"""The benchmarks in their quick mode: tiny sizes, one trial, so they cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.integration.harness import REPO


def test_benchmarks_quick_mode_runs_and_writes_results() -> None:
    proc = subprocess.run([sys.executable, "benchmarks/run.py", "--quick"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "recovery:" in proc.stdout and "commit:" in proc.stdout
    recovery = json.loads((REPO / "benchmarks/results/recovery-quick.json").read_text())
    median = recovery["median"]
    parts = median["detection_s"] + median["reset_s"] + median["sync_s"] + median["first_step_s"]
    assert abs(parts - median["total_s"]) < 1e-6
    assert 0 < median["total_s"] < 30
    commit = json.loads((REPO / "benchmarks/results/commit-quick.json").read_text())
    assert all(entry["median"]["step_ms"] > 0 for entry in commit.values())
