"""`elasticrun.run(func, ...)`: runs a function on every worker of a job, from Python.

The role of `horovod.run`. The options mirror the CLI's flags and build the same frozen
DriverConfig (job_config.build_config); Horovod's names for them are accepted too, and its
options that mean nothing here are refused, each with one line naming it (run_settings.py
reads them). The function travels cloudpickled through the driver's signed server
(api/func_job.py runs the driver in this process; torch/run_func.py is the worker).

Importing this module stays light: the `elasticrun` package imports it, and every worker
imports the package. The driver's modules are imported when run() is called.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from elasticrun.api.run_settings import job_settings
from elasticrun.job.errors import ConfigError


def run(
    func: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    np: int | None = None,
    *,
    min_np: int | None = None,
    max_np: int | None = None,
    shard_size: int = 1,
    hosts: str | Sequence[str] | None = None,
    hostfile: str | os.PathLike[str] | None = None,
    discovery: str | os.PathLike[str] | None = None,
    slots: int | None = None,
    discovery_interval: float = 1.0,
    discovery_timeout: float = 10.0,
    start_timeout: float = 30.0,
    elastic_timeout: float = 600.0,
    reset_limit: int | None = None,
    blacklist_cooldown_range: tuple[float, float] | None = None,
    permanent_blacklist: bool = False,
    collective_timeout: float = 60.0,
    driver_timeout: float = 300.0,
    hang_detection: bool = True,
    hang_timeout: float = 5.0,
    stuck_timeout: float = 30.0,
    stragglers: str = "report",
    backend: str = "auto",
    ssh_port: int | None = None,
    ssh_identity_file: str | os.PathLike[str] | None = None,
    ssh_accept_new_host_keys: bool = False,
    remote_python: str | None = None,
    working_dir: str | os.PathLike[str] | None = None,
    network_interface: str | None = None,
    output_filename: str | os.PathLike[str] | None = None,
    prefix_output_with_timestamp: bool = False,
    port: int = 0,
    launcher: str = "auto",
    agent_token_file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    executable: str | None = None,
    log_level: str = "INFO",
    verbose: bool | int | None = None,
    # Horovod's (and the CLI's) other names for the settings above
    num_proc: int | None = None,
    min_num_proc: int | None = None,
    max_num_proc: int | None = None,
    host_discovery_script: str | os.PathLike[str] | None = None,
    slots_per_host: int | None = None,
    cooldown_range: tuple[float, float] | None = None,
    network_interfaces: Sequence[str] | None = None,
    # Horovod's options without a meaning here: disable_cache is accepted (there is no
    # cache), the MPI ones are refused
    disable_cache: bool | None = None,
    use_gloo: bool | None = None,
    use_mpi: bool | None = None,
    mpi_args: str | None = None,
) -> list[Any]:
    """Runs `func(*args, **kwargs)` on every worker of an elastic job; returns the results
    of the workers of the job's last round, in rank order.

    `func` and its arguments travel cloudpickled (lambdas and closures too); each worker
    calls `elasticrun.torch.init()` first, so `func` may use elasticrun.torch's collectives
    and `elastic.run`. The other arguments are the CLI's flags (see `elasticrun --help`):
    `np`, `min_np`, `max_np`, `shard_size` (workers per replica group, elastic HSDP),
    `hosts` ("node1:2,node2:2" or a list), `hostfile`, `discovery` (a host discovery
    script), `slots`, the timeouts, `launcher` (and with agents `agent_token_file` and
    `port`), ... `env` adds to the workers' environment; `executable` is the Python that
    runs them [default: this one].

    Raises JobFailedError when the job fails (its message names the first failing rank,
    its host and cause: for an exception in `func`, its type and message), ConfigError for
    a bad argument, and KeyboardInterrupt once an interrupted job has stopped its workers.
    """
    options = {name: value for name, value in locals().items()
               if name not in ("func", "args", "kwargs")}
    job = job_settings(func, args, kwargs, options)
    payload = pickle_call(func, args, kwargs)
    from elasticrun.api.func_job import run_function  # the driver: only when used

    return run_function(job.config, payload, job.env, job.log_level)


def pickle_call(func: Callable[..., Any], args: Sequence[Any],
                kwargs: Mapping[str, Any] | None) -> bytes:
    import cloudpickle

    try:
        data: bytes = cloudpickle.dumps((func, tuple(args), dict(kwargs or {})))
        return data
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(f"func and its arguments cannot be pickled: "
                          f"{type(exc).__name__}: {first}") from None
