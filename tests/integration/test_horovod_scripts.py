"""Horovod elastic scripts with only the import changed (examples/
horovod_imagenet_style_elastic.py, in the style of Horovod's ImageNet elastic example) train
on 2 and 4 real workers, survive a SIGKILL of one, and end with bitwise-equal parameters on
every rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.harness import PYTHON, REPO, run_job

SCRIPT = REPO / "examples" / "horovod_imagenet_style_elastic.py"


def _digests(directory: Path) -> dict[str, str]:
    return {path.name: path.read_text().strip() for path in sorted(directory.glob("rank*.txt"))}


@pytest.mark.parametrize(("hosts", "np_args", "options", "final_size"), [
    # 2 workers and a spare host; Adasum on the update, gradients accumulated over 2 passes
    ("localhost:1,127.0.0.1:1,127.0.0.2:1", ["-np", "2", "--min-np", "2", "--max-np", "2"],
     ["--use-adasum", "--batches-per-allreduce", "2", "--kill", "1:0:3"], 2),
    # 4 workers on 2 hosts, one lost and its slot given a new worker; fp16 compression,
    # predivided averaging, SyncBatchNorm (so the BatchNorm buffers agree too)
    ("localhost:2,127.0.0.1:2", ["--min-np", "2"],
     ["--fp16-allreduce", "--gradient-predivide-factor", "2", "--sync-bn", "--kill", "3:0:3"],
     4),
], ids=["2-workers-adasum-passes", "4-workers-fp16-predivide-syncbn"])
def test_a_horovod_script_survives_a_kill_and_ends_bitwise_equal(
        tmp_path: Path, hosts: str, np_args: list[str], options: list[str],
        final_size: int) -> None:
    result = run_job(["-H", hosts, *np_args, PYTHON, str(SCRIPT), "--digest-dir",
                      str(tmp_path), "--samples", "128", *options], timeout=150)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "killed").exists(), "the scheduled SIGKILL did not happen"
    assert "was killed by SIGKILL" in result.stderr
    assert "restoring the last commit" in result.stderr
    digests = _digests(tmp_path)
    assert len(digests) == final_size, digests
    assert len(set(digests.values())) == 1, f"ranks ended with different parameters: {digests}"
    assert result.stdout.count("val loss") == 2  # both epochs validated, through Metric
