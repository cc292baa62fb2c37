"""Slurm: the two ways to start workers inside an allocation, measured on a real Slurm
cluster (tests/slurm/cluster.py: slurmctld and a slurmd per node, each node in its own
network namespace; root only).

srun    `elasticrun --launcher slurm`: every worker is a job step of its own, started with
        srun on its node by the driver.
agents  the batch script starts one `elasticrun agent` per node with srun, and the driver
        (`--launcher agent --discovery slurm`) starts workers through them.

A trial is one `sbatch -N3` job of 3 workers (~1M parameters, a commit every step):
- start: sbatch -> the first completed step at 3 workers (the batch script, the driver,
  3 workers started on 3 nodes, their start-up, the first round);
- grow: node n3 is drained (its worker leaves at a commit), then resumed: resumed -> the
  first completed step at 3 workers again (discovery's notice, the launch, the new
  worker's start-up, the rendezvous and sync);
- launch: of that, resumed -> the new worker's process has started;
- resume: a worker on n2 is SIGKILLed -> the first completed step after recovery.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import PYTHON, REPO, SCRIPTS, bench_env, print_table, read_events, summarize

MODES = ("srun", "agents")
PHASES = ("start_s", "launch_s", "grow_s", "resume_s")
TOKEN = "slurm-benchmark-token-0123456789"
PORT = 29477


def _script(mode: str, tmp: Path) -> Path:
    train = f"{PYTHON} {SCRIPTS / 'er_train.py'}"
    common = "--min-np 1 --network-interface eth0 --discovery-interval 0.3 --start-timeout 60"
    if mode == "srun":
        body = f"exec {PYTHON} -m elasticrun --launcher slurm {common} {train}\n"
    else:
        token = tmp / "token"
        token.write_text(TOKEN)
        body = (
            "ADDR=$(ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1)\n"
            f"srun --overlap --ntasks-per-node=1 sh -c 'exec {PYTHON} -m elasticrun agent "
            f"--driver http://'$ADDR':{PORT} --token-file {token} --host $SLURMD_NODENAME' &\n"
            f"{PYTHON} -m elasticrun --launcher agent --discovery slurm --port {PORT} "
            f"--agent-token-file {token} {common} {train}\n"
            "code=$?\nwait\nexit $code\n")
    script = tmp / "job.sh"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return script


def _wait(what: str, check: Callable[[], bool], cluster: Any, job: str, log: Path,
          timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if job not in " ".join(cluster.queue()) or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            raise RuntimeError(f"the Slurm job ended or hung waiting for {what}: {tail}")
        time.sleep(0.05)


def _steps(out: Path, size: int, after: float = 0.0) -> list[dict[str, Any]]:
    return [e for e in read_events(out) if e["event"] == "step" and e["size"] == size
            and e["time"] > after]


def _worker(tag_value: str, node: str) -> int:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if f"BENCH_TAG={tag_value}".encode() in env and Path(argv0.decode()).name != "srun" \
                and f"ELASTICRUN_HOSTNAME={node}".encode() in env \
                and f"SLURMD_NODENAME={node}".encode() in env:
            return int(entry.name)
    raise RuntimeError(f"no worker on {node}")


def trial(cluster: Any, mode: str, params: float, tmp: Path) -> dict[str, float]:
    out = tmp / "events.jsonl"
    tag = os.urandom(6).hex()
    env = bench_env({"BENCH_OUT": str(out), "BENCH_PARAMS": f"{params:g}",
                     "BENCH_STEPS": "100000", "BENCH_COMMIT_EVERY": "1", "BENCH_TAG": tag})
    submitted = time.time()
    job = cluster.run(["sbatch", "--parsable", "-N3", "--ntasks-per-node=1",
                       f"--output={tmp / 'out'}", f"--chdir={REPO}", str(_script(mode, tmp))],
                      env=env).stdout.strip().split(";")[0]
    try:
        _wait("3 workers", lambda: len(_steps(out, 3)) >= 3, cluster, job, tmp / "out")
        first = _steps(out, 3)[0]["time"]
        cluster.drain("n3")
        _wait("2 workers", lambda: len(_steps(out, 2)) >= 3, cluster, job, tmp / "out")
        resumed = time.time()
        cluster.resume("n3")
        _wait("3 workers again", lambda: bool(_steps(out, 3, resumed)), cluster, job, tmp / "out")
        grown = _steps(out, 3, resumed)[0]["time"]
        started = min(e["at"] for e in read_events(out) if e["event"] == "started"
                      and e["at"] > resumed)
        _wait("steps at 3", lambda: len(_steps(out, 3, resumed)) >= 3, cluster, job, tmp / "out")
        killed = time.time()
        os.kill(_worker(tag, "n2"), signal.SIGKILL)
        _wait("the resume", lambda: bool(_steps(out, 2, killed)), cluster, job, tmp / "out")
        resume = _steps(out, 2, killed)[0]["time"]
    finally:
        cluster.run(["scancel", job], check=False)
        cluster.resume("n3")
        _settle(cluster, job)
    return {"start_s": first - submitted,
            "launch_s": started - resumed, "grow_s": grown - resumed,
            "resume_s": resume - killed}


def _settle(cluster: Any, job: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while job in " ".join(cluster.queue()) and time.monotonic() < deadline:
        time.sleep(0.2)
    cluster.wait_idle([n.name for n in cluster.nodes], timeout)


def bench(trials: int, quick: bool) -> dict[str, Any]:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from tests.slurm.cluster import SlurmCluster, unavailable

    reason = unavailable()
    if reason is not None:
        print(f"\nslurm: skipped: {reason}")
        return {"skipped": reason}
    params = 1e5 if quick else 1e6
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as root:
        cluster = SlurmCluster.create(Path(root), n_nodes=3)
        try:
            for _ in range(trials):
                for mode in MODES:
                    with tempfile.TemporaryDirectory() as tmp:
                        runs[mode].append(trial(cluster, mode, params, Path(tmp)))
        finally:
            cluster.destroy()
    medians = {mode: summarize(r) for mode, r in runs.items()}
    print_table(f"slurm: 3 nodes, ~{params / 1e6:g}M parameters; median of {trials} (s)",
                ["mode", *PHASES], [[mode, *(m[p] for p in PHASES)]
                                    for mode, m in medians.items()])
    return {"median": medians, "trials": runs}


if __name__ == "__main__":
    print(json.dumps(bench(1, True)))
