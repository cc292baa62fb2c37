"""Running a job the command line described, in either form: its DriverConfig -> the
driver in this process, until the job's end; the exit code is the job's."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from elasticrun.api.job_config import build_parts
from elasticrun.driver.driver import Driver
from elasticrun.driver.journal import command_line
from elasticrun.driver.journal.opening import refuse_a_running_job
from elasticrun.driver.processes.output import OutputRouter, WorkerLogs
from elasticrun.job.config import DriverConfig
from elasticrun.job.errors import ConfigError
from elasticrun.system.process_setup import raise_open_file_limit


def run_job(config: DriverConfig, argv: Sequence[str]) -> int:
    """Runs the job to its end; `argv` (the command line's arguments) is kept with the
    journal of a --state-dir job, for a later `--resume --state-dir DIR` alone."""
    if config.state_dir is not None and not config.resume:
        refuse_a_running_job(config.state_dir)
        command_line.record(config.state_dir, argv, Path.cwd())
    parts = build_parts(config)
    raise_open_file_limit()
    output = OutputRouter(sys.stdout.buffer, sys.stderr.buffer, config.output_filename,
                          config.prefix_timestamp, WorkerLogs.of(config.torchrun))
    try:
        driver = Driver(config, parts, output)
        try:
            output.name_run(config.torchrun.run_id or driver.job_id)  # TORCHELASTIC_RUN_ID
        except OSError as exc:
            raise ConfigError(f"--log-dir {config.torchrun.log_dir}: cannot make the run's "
                              f"directory there: {exc.strerror or exc}") from None
        return asyncio.run(driver.run())
    finally:
        output.close()
