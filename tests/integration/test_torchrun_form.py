"""torchrun's command line, `elasticrun` in place of `torchrun`: an unmodified torchrun-style
script as a script and as a module, on one node; no process left behind (run_job checks)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from harness import SCRIPTS, run_job

pytestmark = pytest.mark.timeout(180)

PREFIXED = re.compile(r"^\[(\d+)\]<stdout>:(torchrun-style .*)$", re.MULTILINE)
BOTH_RANKS = {
    "0": "torchrun-style rank=0 world=2 sum=1",
    "1": "torchrun-style rank=1 world=2 sum=1",
}


def test_standalone_script() -> None:
    result = run_job(["--standalone", "--nproc-per-node", "2",
                      str(SCRIPTS / "torchrun_style.py")])
    assert result.returncode == 0, result.stderr
    assert dict(PREFIXED.findall(result.stdout)) == BOTH_RANKS, result.stdout + result.stderr


def test_module_with_tee_into_a_log_dir(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "torchrun_module.py").write_text((SCRIPTS / "torchrun_style.py").read_text())
    logs = tmp_path / "logs"
    result = run_job(["--nproc_per_node=2", "--rdzv-id", "e2e", "--log-dir", str(logs),
                      "--tee", "1", "-m", "torchrun_module"], cwd=work)
    assert result.returncode == 0, result.stderr
    assert dict(PREFIXED.findall(result.stdout)) == BOTH_RANKS, result.stdout + result.stderr
    for rank in ("0", "1"):
        kept = (logs / "e2e" / f"rank.{rank}" / "stdout").read_text()
        assert BOTH_RANKS[rank] in kept
        assert not (logs / "e2e" / f"rank.{rank}" / "stderr").exists()  # --tee 1: stdout
