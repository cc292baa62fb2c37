"""Elastic training on the GPU, end to end: 4 workers (2 hosts x 2 on loopback) share
cuda:0 over NCCL; one is SIGKILLed, or raises, and the survivors abort their communicators,
rebuild and finish in-process with bitwise-equal parameters; a host added mid-run joins;
nothing is left running and no GPU memory is held when the job ends."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.harness import PYTHON, SCRIPTS, JobResult, run_job
from tests.integration.progress import check_job

TRAIN = [PYTHON, str(SCRIPTS / "elastic_train.py")]
COMMON = ["--backend", "nccl", "--start-timeout", "120", "--discovery-interval", "0.2"]


def gpu_env(faults: str = "", epochs: int = 3, **extra: str) -> dict[str, str]:
    return {"TRAIN_DEVICE": "cuda", "TRAIN_NCCL_HOST_PER_WORKER": "1",
            "ELASTICRUN_CUDA_DEVICE": "0", "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1",
            "TRAIN_SAMPLES": "64", "TRAIN_EPOCHS": str(epochs), "TRAIN_BATCH": "4",
            "FAULTS": faults, **extra}


def gpu_processes() -> list[str]:
    """PIDs of processes holding a CUDA context, as nvidia-smi sees them."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def assert_finished_on_nccl(result: JobResult) -> None:
    assert result.returncode == 0, \
        f"job failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    rounds = [r for r in result.records if r["event"] == "round"]
    assert rounds and {r["backend"] for r in rounds} == {"nccl"}
    finals = [r for r in result.records if r["event"] == "final"]
    assert len({r["hash"] for r in finals}) == 1, finals  # bitwise-equal parameters
    pids = {str(r["pid"]) for r in result.records}
    assert not pids & set(gpu_processes()), "a worker still holds the GPU"


@pytest.mark.parametrize("mode", ["sigkill", "exception"])
def test_a_failed_rank_and_the_survivors_recover_in_process(tmp_path: Path, mode: str) -> None:
    result = run_job(["-H", "localhost:2,127.0.0.2:2", "--min-np", "2", *COMMON, *TRAIN],
                     gpu_env(faults=f"6:3:{mode}"), log_dir=tmp_path / "logs", timeout=300)
    assert_finished_on_nccl(result)
    views = check_job(result.records, samples=64, epochs=3)
    assert [v.size for v in views] == [4, 2]
    rounds = [r for r in result.records if r["event"] == "round"]
    first = {r["pid"]: r for r in rounds if r["size"] == 4}
    survivors = {r["pid"]: r for r in rounds if r["size"] == 2}
    assert set(survivors) <= set(first)  # the survivors went on in-process: no new workers
    for pid, later in survivors.items():
        # The aborted round's buffers are gone: at the new round's start a survivor holds no
        # more than it did while training in the first (cuBLAS's workspaces, allocated at
        # the first matmul, included in both).
        steady = max(r["gpu_allocated"] for r in result.records
                     if r["event"] == "step" and r["pid"] == pid and r["size"] == 4)
        assert later["gpu_allocated"] <= steady * 1.05 + (1 << 20), (steady, later)


def test_a_host_added_mid_run(tmp_path: Path) -> None:
    progress = tmp_path / "progress"
    script = tmp_path / "hosts.py"
    script.write_text(f"""#!{PYTHON}
import json
try:
    step, size = json.load(open({str(progress)!r}))
except (OSError, ValueError):
    step, size = 0, 0
print("localhost:2")
if step >= 4:
    print("127.0.0.2:2")
""")
    script.chmod(0o755)
    result = run_job(["-np", "2", "--max-np", "4", "--host-discovery-script", str(script),
                      *COMMON, *TRAIN],
                     gpu_env(epochs=4, PROGRESS_FILE=str(progress), TRAIN_SLOW_BELOW="4"),
                     log_dir=tmp_path / "logs", timeout=300)
    assert_finished_on_nccl(result)
    views = check_job(result.records, samples=64, epochs=4)
    assert [v.size for v in views][:1] == [2] and views[-1].size == 4

