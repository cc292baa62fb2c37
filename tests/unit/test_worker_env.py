"""The environment the driver gives a worker: its place, and the defaults it adds."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from elasticrun.driver.processes.records import EnvSettings, Placed, job_env
from elasticrun.job.config import TorchrunSettings
from elasticrun.protocol import SlotInfo

SETTINGS = EnvSettings(rendezvous_addr="10.0.0.1", rendezvous_port=4000, secret="s",
                       collective_timeout=60, round_timeout=30, driver_timeout=30,
                       gloo_interface="eth1")


def _info(local_size: int) -> SlotInfo:
    return SlotInfo(hostname="h1", rank=1, size=4, local_rank=local_size - 1,
                    local_size=local_size, cross_rank=0, cross_size=2)


@pytest.mark.parametrize("local_size, inherited, expected", [
    (2, {}, "1"),  # workers share the host: one intra-op thread each, as torchrun sets
    (8, {}, "1"),
    (1, {}, None),  # alone on its host: torch's own default (a thread per core)
    (2, {"OMP_NUM_THREADS": "4"}, None),  # the user's value is inherited, not replaced
])
def test_intra_op_threads_default_to_one_where_workers_share_a_host(
        local_size: int, inherited: dict[str, str], expected: str | None) -> None:
    env = job_env(SETTINGS, "h1/0/1-ab", Placed(_info(local_size)), "10.0.0.2", 29500, inherited)
    assert env.get("OMP_NUM_THREADS") == expected


def test_the_gloo_interface_is_the_users_when_set() -> None:
    assert job_env(SETTINGS, "w", Placed(_info(2)), "a", 1, {})["GLOO_SOCKET_IFNAME"] == "eth1"
    assert "GLOO_SOCKET_IFNAME" not in job_env(SETTINGS, "w", Placed(_info(2)), "a", 1,
                                               {"GLOO_SOCKET_IFNAME": "lo"})


def test_every_worker_gets_torchruns_environment_for_its_round() -> None:
    """What torchrun's agent sets (local_elastic_agent.py), so that Lightning picks its
    torchelastic environment, the HF Trainer its ranks, and @record its error file."""
    settings = replace(SETTINGS, run_id="job 7/a", max_restarts=3, error_dir=Path("/logs/j"),
                       torchrun=TorchrunSettings(role="trainer"))
    placed = Placed(_info(2), round=4, group_rank=1, group_size=3, restarts=2)
    env = job_env(settings, "w", placed, "10.0.0.2", 29500, {})
    assert {k: env[k] for k in (
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "ELASTICRUN_ROUND")} == {
        "RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "3", "ROLE_RANK": "1", "ROLE_WORLD_SIZE": "4",
        "ROLE_NAME": "trainer", "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29500",
        "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_RUN_ID": "job 7/a", "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": "/logs/j/torchelastic-error-job_7_a-attempt2-rank1.json",
        "ELASTICRUN_ROUND": "4"}
    assert "CUDA_VISIBLE_DEVICES" not in env


@pytest.mark.parametrize(("nodes_of", "expected"), [
    (None, "/logs/j_x/attempt_2/1/error.json"),  # one node: torchrun's own layout
    (2, "/logs/j_x/h1/attempt_2/1/error.json")])  # several: each node's under its name
def test_the_error_file_under_a_log_dir(nodes_of: int | None, expected: str) -> None:
    settings = replace(SETTINGS, error_dir=Path("/logs/j_x"), torchrun=TorchrunSettings(
        log_dir=Path("/logs"), nodes_of=nodes_of))
    env = job_env(settings, "w", Placed(_info(2), restarts=2), "a", 1, {})
    assert env["TORCHELASTIC_ERROR_FILE"] == expected


def test_virtual_local_rank_gives_each_worker_device_0_of_its_own() -> None:
    settings = replace(SETTINGS, torchrun=TorchrunSettings(virtual_local_rank=True))
    env = job_env(settings, "w", Placed(_info(2)), "a", 1, {})
    assert env["LOCAL_RANK"] == "0" and env["CUDA_VISIBLE_DEVICES"] == "1"
