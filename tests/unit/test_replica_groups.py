"""--shard-size S: rounds of whole replica groups (S consecutive ranks on one host), from the
pure policy to the round machine, the worker's environment and the refusals of bad sizes."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

import elasticrun
from elasticrun import protocol
from elasticrun.api.job_config import build_config
from elasticrun.api.run_settings import job_settings
from elasticrun.cli import horovodrun, main
from elasticrun.cli.config_file import load_config_file
from elasticrun.driver.processes.records import EnvSettings, Placed, job_env
from elasticrun.driver.rounds import events as ev
from elasticrun.driver.rounds.assignment import Assignment, SlotId, assign_keeping_state
from elasticrun.driver.rounds.replica_groups import left_over, whole_groups, whole_size
from elasticrun.job.config import DriverConfig
from elasticrun.job.errors import ConfigError
from elasticrun.protocol import SlotInfo
from tests.unit.machine_sim import Sim, config, of


# --- the policy -----------------------------------------------------------------------------
@pytest.mark.parametrize("slots, shard_size, expected", [
    ({"a": 4, "b": 5, "c": 7}, 2, {"a": 4, "b": 4, "c": 6}),
    ({"a": 8, "b": 6}, 4, {"a": 8, "b": 4}),
    ({"a": 1, "b": 3, "c": 2}, 2, {"b": 2, "c": 2}),  # fewer than S: the host gives none
    ({"a": 3}, 4, {}),
    ({"a": 3, "b": 1, "c": 7}, 1, {"a": 3, "b": 1, "c": 7}),  # S 1: as given
])
def test_each_host_gives_its_slots_rounded_down_to_whole_groups(
        slots: dict[str, int], shard_size: int, expected: dict[str, int]) -> None:
    indices = {host: tuple(range(n)) for host, n in slots.items()}
    assert whole_groups(indices, shard_size) == {h: tuple(range(n)) for h, n in expected.items()}
    assert list(whole_groups(indices, shard_size)) == [h for h in slots if h in expected]


def test_a_group_missing_a_blacklisted_slot_gives_none() -> None:
    """Slot 1 of a left out: group 0 (slots 0, 1) is not whole, group 1 (2, 3) is."""
    assert whole_groups({"a": (0, 2, 3), "b": (0, 1)}, 2) == {"a": (2, 3), "b": (0, 1)}
    assert whole_groups({"a": (0, 2, 3)}, 1) == {"a": (0, 2, 3)}


@pytest.mark.parametrize("max_np, shard_size, expected", [
    (None, 2, None), (8, 2, 8), (7, 2, 6), (3, 4, 0), (7, 1, 7),
])
def test_max_np_is_rounded_down_to_whole_groups(max_np: int | None, shard_size: int,
                                                expected: int | None) -> None:
    assert whole_size(max_np, shard_size) == expected


def test_left_over_names_the_slots_no_group_can_use() -> None:
    assert left_over({"a": 5, "b": 4, "c": 1, "d": 0}, 2) == {"a": 1, "c": 1}
    assert left_over({"a": 5, "b": 1}, 1) == {}


def test_a_keeper_kept_for_the_hand_over_keeps_a_whole_group() -> None:
    """Every host replaced at once: the state's holder stays as rank 0 for one round; with
    S 2 its host gives a whole group, so its rank % S stays its local rank % S."""
    result = assign_keeping_state([("c", 2)], None, [SlotId("a", 0)], shard_size=2)
    assert ranks(result) == {"a[0]": 0, "a[1]": 1, "c[0]": 2, "c[1]": 3}
    plain = assign_keeping_state([("c", 2)], None, [SlotId("a", 0)])
    assert ranks(plain) == {"a[0]": 0, "c[0]": 1, "c[1]": 2}  # S 1: as before


# --- the round machine ----------------------------------------------------------------------
def ranks(assignment: Assignment) -> dict[str, int]:
    return {str(slot): info.rank for slot, info in assignment.items()}


def assert_whole_groups(assignment: Assignment, shard_size: int) -> None:
    assert len(assignment) % shard_size == 0
    for slot, info in assignment.items():
        assert info.rank % shard_size == slot.index % shard_size == info.local_rank % shard_size
        assert info.local_size % shard_size == 0


def test_a_failed_worker_takes_its_group_and_the_survivors_keep_their_ranks() -> None:
    """b[1] fails: b[0], its group's other member, is stopped; the group gets new workers
    (standbys, as the survivors meet --min-np) that join at a commit."""
    sim = Sim(config(np=4, min_np=2, shard_size=2))
    sim.running({"a": 2, "b": 2})
    first = dict(sim.state.assignment)
    assert ranks(first) == {"a[0]": 0, "a[1]": 1, "b[0]": 2, "b[1]": 3}
    kept = {slot: sim.worker_on(slot.host, slot.index).id for slot in first if slot.host == "a"}
    peer = sim.worker_on("b", 0)
    sim.send(ev.WorkerExited(sim.worker_on("b", 1).id, 1))
    [opened] = of(ev.OpenRound, sim.advance(0.0))
    assert opened.number == 2 and opened.new_workers == 0
    assert ranks(opened.assignment) == {"a[0]": 0, "a[1]": 1}
    current = sim.state.round
    assert current is not None and {s: current.members[s] for s in current.members} == kept
    assert [w for stop in of(ev.StopWorkers, sim.log) for w in stop.workers] == [peer.id]
    # The group's new workers start (b[0]'s once its stopped worker is gone)
    assert [str(s.slot) for s in of(ev.Spawn, sim.send(ev.WorkerExited(peer.id, -15)))] == [
        "b[0]"]
    refills = [s for s in of(ev.Spawn, sim.log) if s.round == 3]
    assert sorted(str(s.slot) for s in refills) == ["b[0]", "b[1]"]
    assert all(s.standby for s in refills)
    assert_whole_groups(refills[0].assignment, 2)


def test_a_lost_host_in_the_middle_moves_later_groups_down_by_whole_groups() -> None:
    sim = Sim(config(np=6, min_np=2, shard_size=2))
    sim.running({"a": 2, "b": 2, "c": 2})
    sim.send(ev.WorkerExited(sim.worker_on("b", 0).id, 1))
    [opened] = of(ev.OpenRound, sim.advance(0.0))
    assert ranks(opened.assignment) == {"a[0]": 0, "a[1]": 1, "c[0]": 2, "c[1]": 3}
    assert_whole_groups(opened.assignment, 2)


def test_rounds_use_whole_groups_of_each_host_and_log_the_rest_once() -> None:
    sim = Sim(config(np=4, min_np=2, max_np=6, shard_size=2,
                     discovery_script="hosts.sh"))  # type: ignore[arg-type]
    actions = sim.start({"a": 3, "b": 2})
    assert ranks(sim.state.assignment) == {"a[0]": 0, "a[1]": 1, "b[0]": 2, "b[1]": 3}
    notes = [a.message for a in of(ev.Log, actions) if "unused" in a.message]
    assert notes == ["host a: 1 slot(s) unused: they cannot fill a replica group of "
                     "--shard-size 2"]
    sim.join_all()
    sim.sync_all()
    # The same hosts again: nothing new to say. A host of 5 (two groups) grows the job to
    # --max-np 6: one group of c's; c's last slot fills no group.
    assert not [a for a in of(ev.Log, sim.send(ev.HostsFound({"a": 3, "b": 2})))
                if "unused" in a.message]
    actions = sim.send(ev.HostsFound({"a": 3, "b": 2, "c": 5}))
    standbys = of(ev.Spawn, actions)
    assert sorted(str(s.slot) for s in standbys) == ["c[0]", "c[1]"]
    assert_whole_groups(standbys[0].assignment, 2)
    assert len(standbys[0].assignment) == 6
    notes = [a.message for a in of(ev.Log, actions) if "unused" in a.message]
    assert notes == ["host c: 1 slot(s) unused: they cannot fill a replica group of "
                     "--shard-size 2"]


def test_slots_that_fill_no_group_do_not_count_towards_min_np() -> None:
    """Hosts of 3 and 1 slots with S 2: 2 slots usable, short of --min-np 4."""
    sim = Sim(config(np=4, min_np=4, shard_size=2))
    [fail] = of(ev.Fail, sim.send(ev.JobStarted({"a": 3, "b": 1})))
    assert fail.message.startswith("-np 4 needs 4 slots, but only 2 are available")


def test_shard_size_1_uses_every_slot() -> None:
    sim = Sim(config(np=3, min_np=1, shard_size=1))
    sim.running({"a": 2, "b": 1})
    assert ranks(sim.state.assignment) == {"a[0]": 0, "a[1]": 1, "b[0]": 2}
    sim.send(ev.WorkerExited(sim.worker_on("a", 1).id, 1))
    sim.advance(0.0)
    assert ranks(sim.state.assignment) == {"a[0]": 0, "b[0]": 1}
    assert not [a for a in sim.log if isinstance(a, ev.Log) and "unused" in a.message]


# --- the worker's environment ---------------------------------------------------------------
def test_every_worker_gets_the_shard_size() -> None:
    settings = EnvSettings(rendezvous_addr="10.0.0.1", rendezvous_port=4000, secret="s",
                           collective_timeout=60, round_timeout=30, driver_timeout=30,
                           gloo_interface=None, shard_size=4)
    info = SlotInfo(hostname="h", rank=5, size=8, local_rank=1, local_size=4, cross_rank=1,
                    cross_size=2)
    env = job_env(settings, "w", Placed(info), "10.0.0.2", 29500, {})
    assert env[protocol.ENV_SHARD_SIZE] == "4"
    default = EnvSettings(rendezvous_addr="a", rendezvous_port=1, secret="s",
                          collective_timeout=60, round_timeout=30, driver_timeout=30,
                          gloo_interface=None)
    assert job_env(default, "w", Placed(info), "a", 1, {})[protocol.ENV_SHARD_SIZE] == "1"


# --- sizes that are not whole groups are refused --------------------------------------------
@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command's logging set-up left out: a refusal comes before any job."""
    monkeypatch.setattr(horovodrun, "setup_logging", lambda level: None)


def cli_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main([*args, "python", "train.py"])
    assert exc.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("elasticrun: error: "), lines
    return lines[0].removeprefix("elasticrun: error: ")


@pytest.mark.parametrize("args, message", [
    (["-np", "3", "--shard-size", "2"],
     "-np 3 is not a multiple of --shard-size 2: every replica group has 2 workers"),
    (["-np", "4", "--min-np", "2", "--shard-size", "4"],
     "--min-np 2 is not a multiple of --shard-size 4: every replica group has 4 workers"),
    (["-np", "4", "--max-np", "6", "--shard-size", "4"],
     "--max-np 6 is not a multiple of --shard-size 4: every replica group has 4 workers"),
    (["-H", "a:1,b:1", "--shard-size", "2"],
     "-H/--hosts 'a:1,b:1' has no host with the 2 slots a replica group of --shard-size 2 "
     "needs"),
])
def test_sizes_that_are_not_whole_groups_are_one_line_errors(
        capsys: pytest.CaptureFixture[str], quiet: None, args: list[str],
        message: str) -> None:
    assert cli_error(capsys, *args) == message


def test_a_shard_size_below_1_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--shard-size" in cli_error(capsys, "-np", "2", "--shard-size", "0")
    with pytest.raises(ConfigError, match=r"^--shard-size must be at least 1, got 0$"):
        built(np=2, shard_size=0)


def built(**given: Any) -> DriverConfig:
    """build_config with the CLI's defaults, overridden by keyword."""
    options: dict[str, Any] = dict(
        command=("x",), np=None, min_np=None, max_np=None, hosts=None, hostfile=None,
        discovery_script=None, discovery_interval=1.0, discovery_timeout=10.0,
        slots_per_host=None, start_timeout=30.0, elastic_timeout=600.0, reset_limit=None,
        blacklist_cooldown_range=None, collective_timeout=60.0, network_interface=None,
        output_filename=None, prefix_output_with_timestamp=False)
    return build_config(**{**options, **given})


def test_np_from_hosts_counts_whole_groups() -> None:
    assert built(hosts="a:3,b:2", shard_size=2).np == 4
    assert built(hosts="a:3,b:2").np == 5
    assert built(np=4, shard_size=2).shard_size == 2


RUN_DEFAULTS = {name: p.default for name, p in inspect.signature(elasticrun.run).parameters.items()
                if name not in ("func", "args", "kwargs")}


def run_settings(**given: Any) -> Any:
    return job_settings(print, (), None, {**RUN_DEFAULTS, **given})


def test_run_takes_shard_size_and_refuses_partial_groups_in_its_own_names() -> None:
    assert run_settings(np=4, shard_size=2).config.shard_size == 2
    assert run_settings(np=3).config.shard_size == 1
    with pytest.raises(ConfigError) as error:
        run_settings(np=4, min_np=3, shard_size=2)
    assert str(error.value) == ("min_np 3 is not a multiple of shard_size 2: every replica "
                                "group has 2 workers")
    with pytest.raises(ConfigError, match=r"^shard_size must be an integer, at least 1; got 0$"):
        run_settings(np=2, shard_size=0)


def test_the_config_file_takes_shard_size(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("np: 4\nshard-size: 2\n")
    assert load_config_file(job, horovodrun.cli) == {"np": 4, "shard_size": 2}
