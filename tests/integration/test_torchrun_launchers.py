"""torchrun's multi-node form with several launchers on one host (issue 72): a node is a
launcher process, as under torchrun. Launchers started at the same moment agree on one
driver (the one whose socket binds the endpoint; every other joins as an agent) and run one
job at the full world size; a launcher whose agent the driver refuses never exits 0."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from elasticrun.agent.runner import REFUSED_EXIT
from elasticrun.cli.torchrun_plan import derived_token
from tests.integration.harness import PYTHON, REPO, assert_no_orphans, free_port, job_env
from tests.integration.launchers import launch_at_once

pytestmark = pytest.mark.timeout(240)

WAIT_FOR_STOP = """
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
print("waiting rank", dist.get_rank(), "world", dist.get_world_size(), flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.05)
dist.barrier()
dist.destroy_process_group()
"""


def test_launchers_started_at_once_run_one_job(tmp_path: Path) -> None:
    for attempt in range(2):
        run = launch_at_once(tmp_path, launchers=2, nproc=2)
        assert_no_orphans(run.tag, within=10.0)
        assert run.codes == [0, 0], f"attempt {attempt}:\n{run.describe()}"
        assert run.ranks() == {rank: (4, 6.0) for rank in range(4)}, run.describe()
        assert "in use" not in "".join(run.errs)
        hosting = [err for err in run.errs if "hosts the job's driver" in err]
        assert len(hosting) == 1, run.describe()


def wait_for(proc: subprocess.Popen[bytes], log: Path, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"waiting for {text!r}:\n{log.read_text(errors='replace')}")
        time.sleep(0.05)


def test_a_launcher_whose_agent_is_refused_never_exits_0(tmp_path: Path) -> None:
    """Node b's name is held by an agent already (one started by hand with the job's token):
    the driver refuses b's launcher's agent, and that launcher fails, in one line, while
    the job goes on without it."""
    script, stop = tmp_path / "wait_for_stop.py", tmp_path / "stop"
    script.write_text(WAIT_FOR_STOP)
    port, run_id = free_port(), "refused-node"
    env, tag = job_env()
    line = [PYTHON, "-m", "elasticrun", "--nnodes", "1:3", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
            run_id, "--rdzv-conf", "last_call_timeout=1"]
    token = tmp_path / "token"
    token.write_text(derived_token(run_id))
    logs = {name: tmp_path / f"{name}.log" for name in ("a", "rogue", "b")}
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with open(logs[name], "wb") as out:
            procs[name] = subprocess.Popen(argv, env=env, cwd=REPO, stdin=subprocess.DEVNULL,
                                           stdout=out, stderr=subprocess.STDOUT)
        return procs[name]

    try:
        a = start("a", [*line, "--local-addr", "a", str(script), str(stop)])
        wait_for(a, logs["a"], "round 1: world size 1")
        start("rogue", [PYTHON, "-m", "elasticrun", "agent", "--driver",
                        f"http://127.0.0.1:{port}", "--token-file", str(token), "--host", "b",
                        "--slots", "1"])
        wait_for(a, logs["a"], "agent joined: host b")
        b = start("b", [*line, "--local-addr", "b", str(script), str(stop)])
        assert b.wait(60) == REFUSED_EXIT, logs["b"].read_text()
        refused = [text for text in logs["b"].read_text().splitlines() if "refused" in text]
        assert refused and "already has an agent" in refused[0], logs["b"].read_text()
        stop.touch()
        assert a.wait(60) == 0, logs["a"].read_text()
        assert procs["rogue"].wait(30) == 0
        assert_no_orphans(tag, within=10.0)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
