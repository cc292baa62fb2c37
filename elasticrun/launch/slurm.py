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

from elasticrun.job.errors import ConfigError
from elasticrun.launch.base import WorkerSpec
from elasticrun.launch.local.launcher import LocalProcess, start_local
from elasticrun.launch.plugins import LaunchOptions
from elasticrun.system.timed import within

SRUN = "srun"
# srun reads these from the environment as defaults for its options; the driver's own
# (sbatch's) values would contradict the one-task step a worker is.
STEP_OPTION_VARS = ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE",
                    "SLURM_TASKS_PER_NODE", "SLURM_NNODES", "SLURM_CPUS_PER_TASK",
                    "SLURM_DISTRIBUTION", "SLURM_CPU_BIND", "SLURM_MEM_BIND",
                    "SLURM_EXCLUSIVE", "SLURM_OVERLAP", "SLURM_STEP_ID", "SLURM_STEPID")
SLURM_TOOL_TIMEOUT_S = 5.0


def step_name(spec: WorkerSpec) -> str:
    return f"elasticrun:{spec.worker_id}"


def srun_command(spec: WorkerSpec, srun: str = SRUN) -> list[str]:
    return [srun, "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={spec.host}",
            "--kill-on-bad-exit=0", "--no-kill", "--quiet", "--unbuffered",
            f"--job-name={step_name(spec)}", f"--chdir={spec.cwd}", "--export=ALL", "--",
            *spec.command]


def step_env(spec: WorkerSpec) -> dict[str, str]:
    env = spec.env
    for name in STEP_OPTION_VARS:
        env.pop(name, None)
    return env


class SrunProcess:
    """A worker's step, seen through its srun."""

    def __init__(self, srun: LocalProcess, job_id: str, step_name: str) -> None:
        self._srun = srun
        self._job_id = job_id
        self._step_name = step_name
        self.stdout = srun.stdout
        self.stderr = srun.stderr

    async def wait(self) -> int:
        code = await self._srun.wait()
        if code < 0:  # srun itself was killed: its step may run on without it
            step = await _step_of(self._job_id, self._step_name)
            if step is not None:
                await _scancel(["--signal=KILL", step])
        return code

    async def stop(self, grace_period: float) -> None:
        """SIGTERM to the worker through Slurm (srun itself would cancel the step with
        SIGKILL at once), SIGKILL after the grace period: srun's SIGTERM ends the step."""
        if self._srun.returncode is None:
            step = await _step_of(self._job_id, self._step_name)
            if step is not None:
                await _scancel(["--signal=TERM", step])
                with contextlib.suppress(asyncio.TimeoutError):
                    await within(asyncio.shield(self._srun.wait()), grace_period)
        # srun, on SIGTERM, cancels its step and waits for it (SIGKILL once more after the
        # grace period, if srun itself is stuck: then Slurm is told directly).
        await self._srun.stop(grace_period)
        if self._srun.returncode is None:
            step = await _step_of(self._job_id, self._step_name)
            if step is not None:
                await _scancel(["--signal=KILL", step])


class SlurmLauncher:
    def __init__(self, job_id: str, srun: str = SRUN) -> None:
        self._job_id = job_id
        self._srun = srun

    async def start(self, spec: WorkerSpec) -> SrunProcess:
        srun = await start_local(srun_command(spec, self._srun), step_env(spec), Path.cwd(),
                                 signal.SIGTERM)
        return SrunProcess(srun, self._job_id, step_name(spec))

    async def close(self) -> None:
        return None


async def _step_of(job_id: str, name: str) -> str | None:
    """JOB.STEP of the step named `name`, if Slurm still lists it."""
    out = await _slurm_tool(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"])
    for line in out.splitlines():
        step, _, step_name = line.partition(" ")
        if step_name.strip() == name:
            return step
    return None


async def _scancel(args: list[str]) -> None:
    await _slurm_tool(["scancel", "--quiet", *args])


async def _slurm_tool(argv: list[str]) -> str:
    """A Slurm client command's output; "" when it fails or hangs (bounded)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL)
    except OSError:
        return ""
    try:
        out, _ = await within(proc.communicate(), SLURM_TOOL_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return ""
    return out.decode(errors="replace") if proc.returncode == 0 else ""


def plugin(options: LaunchOptions) -> SlurmLauncher:
    if options.arg not in (None, "", "srun"):
        raise ConfigError(f"expected slurm or slurm:srun, got slurm:{options.arg}")
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        raise ConfigError("not inside a Slurm allocation (SLURM_JOB_ID is not set): run "
                          "elasticrun under sbatch or salloc")
    return SlurmLauncher(job_id)
