"""`elasticrun.run`'s pure parts: arguments -> the job's settings, the results that count,
the result endpoint's parts, and that `import elasticrun` stays light."""

from __future__ import annotations

import base64
import inspect
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import elasticrun
from elasticrun.api.func_job import last_round_results
from elasticrun.api.run import pickle_call
from elasticrun.api.run_settings import JobSettings, job_settings, python_names
from elasticrun.driver.hosts.registry import HostRegistry
from elasticrun.driver.rounds.assignment import SlotId
from elasticrun.driver.rounds.state import JobState, Round, WorkerRecord
from elasticrun.driver.server.payload import BadRequest
from elasticrun.driver.server.results_api import ReceivedResult, ResultEndpoints
from elasticrun.driver.server.signing import PAYLOAD
from elasticrun.job.errors import ConfigError, JobFailedError
from elasticrun.protocol import SlotInfo

REPO = Path(__file__).resolve().parents[2]
DEFAULTS = {name: p.default for name, p in inspect.signature(elasticrun.run).parameters.items()
            if name not in ("func", "args", "kwargs")}


def settings(**given: Any) -> JobSettings:
    return job_settings(print, (), None, {**DEFAULTS, **given})


def refusal(**given: Any) -> str:
    with pytest.raises(ConfigError) as error:
        settings(**given)
    message = str(error.value)
    assert "\n" not in message
    return message


# --- arguments -> settings ------------------------------------------------------------------
def test_np_alone_runs_the_worker_module_on_localhost() -> None:
    job = settings(np=2)
    config = job.config
    assert config.command == (sys.executable, "-m", "elasticrun.torch.run_func")
    assert config.hosts == (("localhost", 2),)
    assert (config.np, config.min_np, config.max_np, config.elastic) == (2, 2, 2, False)
    assert (config.start_timeout, config.elastic_timeout) == (30.0, 600.0)
    assert job.env == {} and job.log_level == "INFO"
    # horovod.run's default None is the CLI's default
    assert settings(np=2, start_timeout=None, elastic_timeout=None).config == config


def test_the_cli_settings_reach_the_config() -> None:
    config = settings(np=4, min_np=2, max_np=8, hosts=["node1:2", "node2:2"], reset_limit=3,
                      elastic_timeout=5, start_timeout=7.5, ssh_port=2222,
                      ssh_identity_file="~/.ssh/k", network_interface="eth0",
                      output_filename="out", executable="/opt/py/bin/python",
                      blacklist_cooldown_range=(1, 2), working_dir="/tmp",
                      stragglers="evict").config
    assert config.hosts == (("node1", 2), ("node2", 2))
    assert (config.np, config.min_np, config.max_np, config.reset_limit) == (4, 2, 8, 3)
    assert (config.elastic_timeout, config.start_timeout, config.ssh_port) == (5, 7.5, 2222)
    assert config.ssh_identity_file == Path("~/.ssh/k")
    assert config.output_filename == Path("out") and config.network_interface == "eth0"
    assert config.command[0] == "/opt/py/bin/python"
    assert config.blacklist_cooldown == (1.0, 2.0) and config.working_dir == Path("/tmp")
    assert config.stragglers == "evict"


def test_horovods_names_are_accepted() -> None:
    config = settings(num_proc=4, min_num_proc=2, max_num_proc=8, slots=2,
                      host_discovery_script="hosts.sh", cooldown_range=(1, 4),
                      network_interfaces=["eth1"], disable_cache=True, use_gloo=True,
                      use_mpi=False).config
    assert (config.np, config.min_np, config.max_np) == (4, 2, 8)
    assert config.discovery_script == Path("hosts.sh") and config.slots_per_host == 2
    assert config.blacklist_cooldown == (1.0, 4.0) and config.network_interface == "eth1"
    assert settings(np=3, num_proc=3).config.np == 3  # both names, one value: fine
    assert settings(np=1, discovery=Path("h.sh")).config.discovery_script == Path("h.sh")


@pytest.mark.parametrize(("given", "named"), [
    ({"np": 2, "num_proc": 3}, "give only one of np and num_proc"),
    ({"discovery": "a.sh", "host_discovery_script": "b.sh"}, "discovery and host_discovery"),
    ({"np": 2, "use_mpi": True}, "use_mpi=True: elasticrun has no MPI"),
    ({"np": 2, "mpi_args": "-x NCCL_DEBUG"}, "mpi_args: elasticrun has no MPI"),
    ({"np": 2, "use_gloo": False}, "use_gloo=False"),
    ({"np": 2, "network_interfaces": ["eth0", "eth1"]}, "network_interfaces: elasticrun uses "
                                                         "one interface"),
    ({"np": "2"}, "np must be an integer, at least 1; got '2'"),
    ({"np": 0}, "np must be an integer"),
    ({"np": True}, "np must be an integer"),
    ({"np": 2, "ssh_port": 70000}, "ssh_port must be an integer, 1..65535"),
    ({"np": 2, "reset_limit": -1}, "reset_limit must be an integer, at least 0"),
    ({"np": 2, "start_timeout": 0}, "start_timeout must be a positive number"),
    ({"np": 2, "elastic_timeout": "10"}, "elastic_timeout must be a positive number"),
    ({"np": 2, "hosts": 5}, "hosts must be 'host:slots,...'"),
    ({"np": 2, "hosts": "a:2", "hostfile": "h"}, "give only one of hosts, hostfile, discovery"),
    ({"np": 2, "hosts": "a:x"}, "hosts: "),
    ({"np": 2, "hostfile": 3}, "hostfile must be a path"),
    ({"np": 2, "env": {"A": 1}}, "env: 'A'=1"),
    ({"np": 2, "env": ["A=1"]}, "env must be a dict"),
    ({"np": 2, "log_level": "LOUD"}, "log_level must be one of"),
    ({"np": 2, "stragglers": "kick"}, "stragglers must be one of report, evict, off, got "),
    ({"np": 2, "blacklist_cooldown_range": (2,)}, "blacklist_cooldown_range must be"),
    ({"np": 2, "min_np": 3}, "min_np must be between 1 and np (2), got 3"),
    ({"np": 4, "max_np": 3}, "max_np must be at least np (4), got 3"),
    ({}, "np is required unless hosts or min_np is given"),
])
def test_a_bad_argument_is_one_line_naming_it(given: dict[str, Any], named: str) -> None:
    assert named in refusal(**given)


def test_func_args_and_kwargs_are_checked() -> None:
    with pytest.raises(ConfigError, match="func must be callable, got int"):
        job_settings(3, (), None, {**DEFAULTS, "np": 1})
    with pytest.raises(ConfigError, match="args must be a tuple or a list, got str"):
        job_settings(print, "ab", None, {**DEFAULTS, "np": 1})
    with pytest.raises(ConfigError, match="kwargs must be a dict with string keys"):
        job_settings(print, (), {1: 2}, {**DEFAULTS, "np": 1})


def test_verbose_env_and_log_level() -> None:
    assert settings(np=1, verbose=True).log_level == "DEBUG"
    assert settings(np=1, log_level="warning").log_level == "WARNING"
    assert settings(np=1, env={"A": "1"}).env == {"A": "1"}


def test_cli_flags_in_messages_become_argument_names() -> None:
    assert python_names("--min-np must be between 1 and -np (2), got 3") == \
        "min_np must be between 1 and np (2), got 3"
    assert python_names("-H/--hosts 'x' gives no slots") == "hosts 'x' gives no slots"
    assert python_names("--blacklist-cooldown-range expects 0 < MIN <= MAX") == \
        "blacklist_cooldown_range expects 0 < MIN <= MAX"
    assert python_names("--host-discovery-script ./h.sh: not found") == \
        "discovery ./h.sh: not found"
    assert python_names("a host-name and co-op stay") == "a host-name and co-op stay"


def test_the_call_travels_cloudpickled() -> None:
    offset = 5
    func, args, kwargs = cloudpickle.loads(pickle_call(lambda a, b=0: a + b + offset, [1],
                                                       {"b": 2}))
    assert func(*args, **kwargs) == 8 and args == (1,)
    with pytest.raises(ConfigError, match="func and its arguments cannot be pickled: "
                                          "TypeError: .*lock"):
        pickle_call(print, (threading.Lock(),), None)


# --- which results count ----------------------------------------------------------------
def _state(members: dict[SlotId, str], number: int = 3) -> JobState:
    state = JobState(HostRegistry())
    ranks = {slot: rank for rank, slot in enumerate(sorted(members))}
    assignment = {slot: SlotInfo(slot.host, rank, len(members), slot.index, 1, 0, 1)
                  for slot, rank in ranks.items()}
    # Members listed out of rank order: the order of the results comes from the ranks.
    state.round = Round(number, assignment, dict(reversed(list(members.items()))), 0, 0.0)
    return state


def test_the_last_rounds_results_in_rank_order() -> None:
    a, b = SlotId("a", 0), SlotId("b", 0)
    state = _state({a: "w1", b: "w2"})
    received = {"w2": ReceivedResult(3, 1, b"two"), "w1": ReceivedResult(3, 0, b"one"),
                "gone": ReceivedResult(2, 2, b"an earlier round's worker")}
    assert last_round_results(state, received) == [(0, "a", b"one"), (1, "b", b"two")]


def test_a_missing_or_stale_result_names_the_rank() -> None:
    a, b = SlotId("a", 0), SlotId("b", 0)
    state = _state({a: "w1", b: "w2"})
    with pytest.raises(JobFailedError, match="rank 1 on host b exited 0 without sending its "
                                             "result"):
        last_round_results(state, {"w1": ReceivedResult(3, 0, b"")})
    with pytest.raises(JobFailedError, match="rank 1 on host b sent its result as rank 1 of "
                                             "round 2, but the job ended in round 3"):
        last_round_results(state, {"w1": ReceivedResult(3, 0, b""),
                                   "w2": ReceivedResult(2, 1, b"")})


# --- the result endpoint ------------------------------------------------------------------
class _Request(dict):  # type: ignore[type-arg]
    """What a handler reads of a request: its checked JSON body."""


def _part(part: int, parts: int, data: bytes, worker: str = "w1") -> _Request:
    return _Request({PAYLOAD: {"worker_id": worker, "round": 1, "rank": 0, "part": part,
                               "parts": parts, "data": base64.b64encode(data).decode()}})


async def test_a_result_arrives_in_parts() -> None:
    state = JobState(HostRegistry())
    state.workers["w1"] = WorkerRecord("w1", SlotId("a", 0), 0)
    endpoints = ResultEndpoints(state)
    refused = await endpoints.result(_part(0, 1, b"x"))  # type: ignore[arg-type]
    assert refused.status == 404  # a job of a command: nothing to take
    endpoints.payload = b"the call"
    answer = await endpoints.function(_Request(  # type: ignore[arg-type]
        {PAYLOAD: {"worker_id": "w1"}}))
    assert base64.b64decode(json.loads(answer.text or "")["payload"]) == b"the call"
    assert (await endpoints.result(_part(0, 1, b"x", "nobody"))).status == 403  # type: ignore[arg-type]

    for request in (_part(0, 3, b"ab"), _part(1, 3, b"cd"), _part(1, 3, b"cd"),  # resent
                    _part(2, 3, b"e")):
        assert (await endpoints.result(request)).status == 200  # type: ignore[arg-type]
    assert endpoints.received == {"w1": ReceivedResult(1, 0, b"abcde")}
    assert (await endpoints.result(_part(2, 3, b"e"))).status == 200  # type: ignore[arg-type]
    assert endpoints.received["w1"].data == b"abcde"
    with pytest.raises(BadRequest, match="part 2 of 3 came before part 1"):
        await endpoints.result(_part(0, 3, b"ab"))  # type: ignore[arg-type]
        await endpoints.result(_part(2, 3, b"e"))  # type: ignore[arg-type]
    with pytest.raises(BadRequest, match="out of range"):
        await endpoints.result(_part(3, 3, b""))  # type: ignore[arg-type]


# --- import elasticrun stays light ---------------------------------------------------------
def test_importing_elasticrun_imports_no_driver_and_no_torch() -> None:
    code = ("import sys, elasticrun; "
            "assert callable(elasticrun.run); "
            "assert elasticrun.run.__module__ == 'elasticrun.api.run'; "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.split()
    assert not set(out) & {"torch", "aiohttp", "paramiko", "click", "cloudpickle", "yaml"}
