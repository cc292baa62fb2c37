"""How benchmarks/hsdp.py launches its jobs, each run to its end: scripts/er_hsdp_train.py
under elasticrun on hosts of this machine (127.0.0.x, SHARD slots each), and torch's own
HSDP without elasticity (scripts/hsdp_native.py under torch.distributed.run).
"""

from __future__ import annotations

from pathlib import Path

from benchlib import PYTHON, SCRIPTS, Jobs, bench_env, elasticrun_command

ER_SCRIPT = SCRIPTS / "er_hsdp_train.py"
NATIVE_SCRIPT = SCRIPTS / "hsdp_native.py"
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
SHARD = 2
JOB_TIMEOUT_S = 300.0
STALL_S = 90.0


def hosts(groups: int) -> str:
    return ",".join(f"{host}:{SHARD}" for host in HOSTS[:groups])


def run_elasticrun(flags: list[str], env: dict[str, str], out: Path, what: str) -> None:
    """scripts/er_hsdp_train.py under `elasticrun FLAGS`, its events written to `out`."""
    with Jobs() as jobs:
        jobs.start(elasticrun_command(flags, ER_SCRIPT), bench_env({"BENCH_OUT": str(out),
                                                                    **env}))
        jobs.wait(JOB_TIMEOUT_S, what, progress=out, stall_s=STALL_S)


def run_native(env: dict[str, str], out: Path, what: str) -> None:
    """torch's own HSDP: scripts/hsdp_native.py on 2 x SHARD processes of one torchrun."""
    with Jobs() as jobs:
        jobs.start([PYTHON, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", str(2 * SHARD), str(NATIVE_SCRIPT)],
                   bench_env({"BENCH_OUT": str(out), **env}))
        jobs.wait(JOB_TIMEOUT_S, what, progress=out, stall_s=STALL_S)
