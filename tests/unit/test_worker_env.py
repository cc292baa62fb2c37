"""The environment the driver gives a worker: its place, and the defaults it adds."""

from __future__ import annotations

import pytest

from elasticrun.driver.processes.records import EnvSettings, job_env
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
    env = job_env(SETTINGS, "h1/0/1-ab", _info(local_size), "10.0.0.2", 29500, inherited)
    assert env.get("OMP_NUM_THREADS") == expected


def test_the_gloo_interface_is_the_users_when_set() -> None:
    assert job_env(SETTINGS, "w", _info(2), "a", 1, {})["GLOO_SOCKET_IFNAME"] == "eth1"
    assert "GLOO_SOCKET_IFNAME" not in job_env(SETTINGS, "w", _info(2), "a", 1,
                                               {"GLOO_SOCKET_IFNAME": "lo"})
