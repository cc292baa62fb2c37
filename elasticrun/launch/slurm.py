"""`--launcher slurm`: inside a Slurm allocation, each worker is a job step of its own,
started with srun on its node.

    srun --overlap --nodes=1 --ntasks=1 --nodelist=HOST --kill-on-bad-exit=0 ... COMMAND

--overlap lets the steps share the allocation's CPUs with each other (and with the step
the driver runs in); --kill-on-bad-exit=0 keeps one worker's failure from ending the
others; --no-kill keeps a lost node from ending the whole job. srun runs on the driver's
node as its child: it carries the worker's output, exit code and signals, and its own
parent-death signal takes the step down with the driver. The worker's environment travels
as srun's (never on a command line).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

from elasticrun.errors import ConfigError
from elasticrun.launch.base import WorkerSpec
from elasticrun.launch.local import LocalProcess, start_local
from elasticrun.launch.plugins import LaunchOptions
from elasticrun.timed import within

SRUN = "srun"
# srun reads these from the environment as defaults for its options; the driver's own
# (sbatch's) values would contradict the one-task step a worker is.
STEP_OPTION_VARS = ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE",
                    "SLURM_TASKS_PER_NODE", "SLURM_NNODES", "SLURM_CPUS_PER_TASK",
                    "SLURM_DISTRIBUTION", "SLURM_CPU_BIND", "SLURM_MEM_BIND",
                    "SLURM_EXCLUSIVE", "SLURM_OVERLAP", "SLURM_STEP_ID", "SLURM_STEPID")
CANCEL_TIMEOUT_S = 5.0


def srun_command(spec: WorkerSpec, srun: str = SRUN) -> list[str]:
    return [srun, "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={spec.host}",
            "--kill-on-bad-exit=0", "--no-kill", "--quiet", "--unbuffered",
            f"--job-name=elasticrun:{spec.worker_id}", f"--chdir={spec.cwd}",
            "--export=ALL", "--", *spec.command]


def step_env(spec: WorkerSpec) -> dict[str, str]:
    env = spec.env
    for name in STEP_OPTION_VARS:
        env.pop(name, None)
    return env


class SrunProcess:
    """A worker's step, seen through its srun."""

    def __init__(self, srun: LocalProcess) -> None:
        self._srun = srun
        self.stdout = srun.stdout
        self.stderr = srun.stderr

    async def wait(self) -> int:
        return await self._srun.wait()

    async def stop(self, grace_period: float) -> None:
        # srun passes SIGTERM on to the worker; it ends when the worker does (or at the
        # SIGKILL after the grace period, which Slurm turns into the end of the step).
        await self._srun.stop(grace_period)


class SlurmLauncher:
    def __init__(self, srun: str = SRUN) -> None:
        self._srun = srun

    async def start(self, spec: WorkerSpec) -> SrunProcess:
        srun = await start_local(srun_command(spec, self._srun), step_env(spec), Path.cwd(),
                                 signal.SIGTERM)
        return SrunProcess(srun)

    async def close(self) -> None:
        return None


async def cancel_step(job_step: str) -> None:
    """scancel a step, bounded: for a step whose srun is gone."""
    with contextlib.suppress(OSError, asyncio.TimeoutError):
        proc = await asyncio.create_subprocess_exec(
            "scancel", "--signal=KILL", job_step, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        await within(proc.wait(), CANCEL_TIMEOUT_S)


def plugin(options: LaunchOptions) -> SlurmLauncher:
    if options.arg not in (None, "", "srun"):
        raise ConfigError(f"expected slurm or slurm:srun, got slurm:{options.arg}")
    if "SLURM_JOB_ID" not in os.environ:
        raise ConfigError("not inside a Slurm allocation (SLURM_JOB_ID is not set): run "
                          "elasticrun under sbatch or salloc")
    return SlurmLauncher()
