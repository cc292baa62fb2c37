"""`--discovery slurm`'s pure parts: which node states Slurm runs no work in, how sinfo's
listing is read, where the slots come from. (tests/slurm runs it on a real cluster.)"""

from __future__ import annotations

import pytest

from elasticrun.discovery.plugins import DiscoveryOptions, load_discovery
from elasticrun.discovery.slurm import SlurmDiscovery, node_states, slots_from, unusable
from elasticrun.job.errors import ConfigError


@pytest.mark.parametrize("state", ["idle", "mixed", "allocated", "completing", "planned",
                                   "IDLE", "mixed-"])
def test_states_that_run_work(state: str) -> None:
    assert not unusable(state)


@pytest.mark.parametrize("state", ["drained", "draining", "drain", "down", "down*", "idle*",
                                   "fail", "failing", "maint", "reboot_issued", "idle~",
                                   "powered_down", "future", "unknown"])
def test_states_that_do_not(state: str) -> None:
    assert unusable(state)


def test_a_node_in_two_partitions_is_unusable_if_either_line_says_so() -> None:
    listing = "n1 idle\nn2 mixed\nn2 draining\nn3 down*\nn3 idle\nbad line here\n"
    assert node_states(listing) == {"n1": "idle", "n2": "draining", "n3": "down*"}


def test_slots_come_from_the_argument_then_the_environment_then_the_default() -> None:
    assert slots_from("4", {"ELASTICRUN_SLURM_SLOTS": "2"}, 1) == 4
    assert slots_from(None, {"ELASTICRUN_SLURM_SLOTS": "2", "SLURM_NTASKS_PER_NODE": "8"},
                      1) == 2
    assert slots_from(None, {"SLURM_NTASKS_PER_NODE": "8"}, 1) == 8
    assert slots_from(None, {"SLURM_NTASKS_PER_NODE": "2(x3)"}, 3) == 3
    with pytest.raises(ConfigError, match="slurm:SLOTS: expected a whole number"):
        slots_from("0", {}, 1)


def test_outside_an_allocation_the_source_refuses_in_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    monkeypatch.delenv("SLURM_NODELIST", raising=False)
    with pytest.raises(ConfigError) as info:
        load_discovery("slurm", DiscoveryOptions(None, 1, 5.0))
    assert "not inside a Slurm allocation" in str(info.value)
    assert "\n" not in str(info.value)


def test_inside_an_allocation_it_describes_the_node_list() -> None:
    source = SlurmDiscovery(2, 5.0, {"SLURM_JOB_NODELIST": "n[1-3]"})
    assert source.describe() == "Slurm allocation n[1-3]"
