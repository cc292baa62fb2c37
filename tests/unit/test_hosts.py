"""Unit tests for elasticrun.driver.hosts.HostRegistry: discovery state, blacklist, cooldown."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticrun.driver.hosts.registry import HostRegistry
from elasticrun.driver.rounds.capacity import Shortfall, shortfall, start_refusal
from elasticrun.job.config import DriverConfig, TorchrunSettings

T0 = 1000.0


def test_initially_empty() -> None:
    registry = HostRegistry()
    assert registry.discovered == {}
    assert registry.usable(T0) == {}
    assert registry.next_cooldown_end(T0) is None
    assert registry.blacklist_snapshot() == {}


def test_update_replaces_and_discovered_is_a_copy() -> None:
    registry = HostRegistry()
    registry.update({"a": 1, "b": 2})
    registry.update({"c": 3})
    assert registry.discovered == {"c": 3}
    registry.discovered["x"] = 9
    assert registry.discovered == {"c": 3}


def test_update_copies_its_input() -> None:
    registry = HostRegistry()
    hosts = {"a": 1}
    registry.update(hosts)
    hosts["b"] = 2
    assert registry.discovered == {"a": 1}


def test_usable_keeps_discovery_order_and_skips_zero_slots() -> None:
    registry = HostRegistry()
    registry.update({"c": 2, "a": 0, "b": 1, "d": 4})
    usable = registry.usable(T0)
    assert usable == {"c": 2, "b": 1, "d": 4}
    assert list(usable) == ["c", "b", "d"]


def test_usable_excludes_blacklisted() -> None:
    registry = HostRegistry()
    registry.update({"a": 1, "b": 2, "c": 3})
    registry.blacklist("b", T0)
    assert list(registry.usable(T0)) == ["a", "c"]
    assert registry.is_blacklisted("b", T0)
    assert not registry.is_blacklisted("a", T0)


def test_permanent_blacklist_without_cooldown() -> None:
    registry = HostRegistry()
    registry.update({"a": 1, "b": 1})
    entry = registry.blacklist("a", T0)
    assert entry.until is None
    assert entry.failures == 1
    for later in (T0 + 1, T0 + 1e6, T0 + 1e12):
        assert registry.is_blacklisted("a", later)
        assert list(registry.usable(later)) == ["b"]
    assert registry.next_cooldown_end(T0) is None
    assert registry.blacklist("a", T0 + 5).failures == 2
    assert registry.blacklist("a", T0 + 5).until is None


def test_blacklist_of_undiscovered_host_applies_when_it_appears() -> None:
    registry = HostRegistry()
    registry.blacklist("late", T0)
    registry.update({"late": 2, "ok": 1})
    assert registry.usable(T0 + 10) == {"ok": 1}


def test_blacklist_snapshot_is_a_copy() -> None:
    registry = HostRegistry()
    registry.blacklist("a", T0)
    snapshot = registry.blacklist_snapshot()
    assert set(snapshot) == {"a"}
    snapshot.clear()
    assert set(registry.blacklist_snapshot()) == {"a"}


def horovod_cooldown(low: float, high: float, count: int, jitter: float) -> float:
    """Horovod's HostState._set_cooldown_period, as written there (count already
    incremented for this blacklisting; jitter is its random.uniform(0, 1))."""
    cooldown_delay = low * (1 << count) + (jitter * low)
    return max(low, min(high, cooldown_delay))


def test_cooldown_first_failure_and_host_returns() -> None:
    low, high = 10.0, 300.0
    registry = HostRegistry(cooldown_range=(low, high), rng=random.Random(1))
    registry.update({"a": 2, "b": 1})
    entry = registry.blacklist("a", T0)
    assert entry.until is not None
    delay = entry.until - T0
    assert 2 * low <= delay < 3 * low  # MIN * 2**1 + uniform(0, 1) * MIN
    assert list(registry.usable(T0)) == ["b"]
    assert list(registry.usable(entry.until - 0.001)) == ["b"]
    assert registry.is_blacklisted("a", entry.until - 0.001)
    # At `until` and after, the host is back, in its discovery position.
    assert not registry.is_blacklisted("a", entry.until)
    assert list(registry.usable(entry.until)) == ["a", "b"]
    assert list(registry.usable(entry.until + 1000)) == ["a", "b"]


@pytest.mark.parametrize(("low", "high"), [(1.0, 2.0), (2.0, 50.0), (0.5, 7.0), (30.0, 600.0)])
def test_cooldown_matches_horovods_schedule(low: float, high: float) -> None:
    """The same delays as Horovod for the same random draws, failure after failure."""
    draws = random.Random(5)
    expected_draws = random.Random(5)
    registry = HostRegistry(cooldown_range=(low, high), rng=draws)
    registry.update({"a": 1})
    now = T0
    for count in range(1, 12):
        entry = registry.blacklist("a", now)
        assert entry.failures == count and entry.until is not None
        want = horovod_cooldown(low, high, count, expected_draws.uniform(0, 1))
        assert entry.until - now == pytest.approx(want)
        assert low - 1e-9 <= entry.until - now <= high + 1e-9
        now = entry.until + 1.0  # the host returns, then fails again


def test_cooldown_for_range_1_2_is_two_seconds() -> None:
    """Horovod's first cooldown for --blacklist-cooldown-range 1 2 is 2 s, whatever the
    draw; a host must not come back earlier than a Horovod user planned for."""
    for seed in range(50):
        registry = HostRegistry(cooldown_range=(1.0, 2.0), rng=random.Random(seed))
        assert registry.blacklist("h", T0).until == pytest.approx(T0 + 2.0)


def test_cooldown_grows_exponentially_and_is_capped() -> None:
    low, high = 2.0, 50.0
    registry = HostRegistry(cooldown_range=(low, high), rng=random.Random(42))
    registry.update({"a": 1})
    now = T0
    delays = []
    for failures in range(1, 10):
        entry = registry.blacklist("a", now)
        assert entry.until is not None
        delay = entry.until - now
        assert min(high, low * 2 ** failures) <= delay + 1e-9
        assert delay <= min(high, low * 2 ** failures + low) + 1e-9
        delays.append(delay)
        now = entry.until + 1.0
    # 4, 8, 16, 32 (+ up to MIN): strictly growing while below the cap.
    assert delays[0] < delays[1] < delays[2] < delays[3]
    assert delays[-1] == pytest.approx(high)
    assert delays[-2] == pytest.approx(high)


def test_cooldown_jitter_is_deterministic_with_seeded_rng() -> None:
    def run(seed: int) -> list[float | None]:
        registry = HostRegistry(cooldown_range=(1.0, 1000.0), rng=random.Random(seed))
        return [registry.blacklist("h", T0).until for _ in range(6)]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_cooldown_jitter_uses_the_given_rng() -> None:
    class Fixed(random.Random):
        def uniform(self, a: float, b: float) -> float:
            return b

    registry = HostRegistry(cooldown_range=(4.0, 100.0), rng=Fixed())
    assert registry.blacklist("h", T0).until == pytest.approx(T0 + 12.0)  # 4*2 + 4
    assert registry.blacklist("h", T0).until == pytest.approx(T0 + 20.0)  # 4*4 + 4


def test_cooldown_min_equals_max() -> None:
    registry = HostRegistry(cooldown_range=(5.0, 5.0), rng=random.Random(0))
    for _ in range(4):
        entry = registry.blacklist("h", T0)
        assert entry.until == pytest.approx(T0 + 5.0)


def test_failures_are_per_host() -> None:
    registry = HostRegistry(cooldown_range=(1.0, 100.0), rng=random.Random(0))
    registry.blacklist("a", T0)
    registry.blacklist("a", T0)
    assert registry.blacklist("b", T0).failures == 1
    assert registry.blacklist_snapshot()["a"].failures == 2


def test_next_cooldown_end_reports_earliest_discovered_host() -> None:
    registry = HostRegistry(cooldown_range=(10.0, 1000.0), rng=random.Random(3))
    registry.update({"a": 1, "b": 1})
    end_a = registry.blacklist("a", T0).until
    end_b = registry.blacklist("b", T0 + 100).until
    end_gone = registry.blacklist("gone", T0 - 5).until  # not discovered
    assert end_a is not None and end_b is not None and end_gone is not None
    assert end_gone < end_a < end_b
    assert registry.next_cooldown_end(T0) == end_a
    # Once a's cooldown is over, b is next; ended cooldowns are not reported.
    assert registry.next_cooldown_end(end_a) == end_b
    assert registry.next_cooldown_end(end_b) is None


def test_next_cooldown_end_only_discovered_hosts() -> None:
    registry = HostRegistry(cooldown_range=(10.0, 20.0), rng=random.Random(0))
    registry.update({"a": 1})
    registry.blacklist("other", T0)
    assert registry.next_cooldown_end(T0) is None
    registry.update({"a": 1, "other": 2})
    assert registry.next_cooldown_end(T0) == registry.blacklist_snapshot()["other"].until


def test_next_cooldown_end_ignores_permanent_entries() -> None:
    registry = HostRegistry()
    registry.update({"a": 1})
    registry.blacklist("a", T0)
    assert registry.next_cooldown_end(T0) is None


@given(
    low=st.floats(min_value=0.001, max_value=100.0),
    factor=st.floats(min_value=1.0, max_value=1000.0),
    seed=st.integers(min_value=0, max_value=2**32),
    failures=st.integers(min_value=1, max_value=40),
)
@settings(max_examples=200)
def test_property_cooldown_within_range_and_non_decreasing_base(
    low: float, factor: float, seed: int, failures: int
) -> None:
    high = low * factor
    registry = HostRegistry(cooldown_range=(low, high), rng=random.Random(seed))
    registry.update({"h": 1})
    now = T0
    for n in range(1, failures + 1):
        entry = registry.blacklist("h", now)
        assert entry.failures == n
        assert entry.until is not None
        delay = entry.until - now
        assert low * (1 - 1e-9) <= delay <= high * (1 + 1e-9)
        assert delay >= min(high, low * 2 ** (n - 1)) * (1 - 1e-9)
        assert registry.is_blacklisted("h", now)
        assert registry.usable(now) == {}
        assert registry.next_cooldown_end(now) == entry.until
        assert registry.usable(entry.until) == {"h": 1}
        now = entry.until


# --------------------------------------------------------------------------- drain / undrain


def test_drained_host_is_not_usable() -> None:
    registry = HostRegistry()
    registry.update({"a": 1, "b": 2, "c": 3})
    registry.drain("b")
    assert registry.drained == {"b"}
    assert registry.usable(T0) == {"a": 1, "c": 3}
    assert registry.discovered == {"a": 1, "b": 2, "c": 3}
    registry.drained.add("c")  # a copy
    assert registry.drained == {"b"}


def test_draining_an_undiscovered_host_does_nothing() -> None:
    registry = HostRegistry()
    registry.update({"a": 1})
    registry.drain("zz")
    assert registry.drained == set()
    registry.update({"a": 1, "zz": 2})
    assert registry.usable(T0) == {"a": 1, "zz": 2}


def test_drained_host_that_vanishes_and_returns_is_usable_again() -> None:
    registry = HostRegistry()
    registry.update({"a": 1, "b": 2})
    registry.drain("b")
    registry.update({"a": 1, "b": 2})  # still listed: stays drained
    assert registry.drained == {"b"}
    registry.update({"a": 1})
    assert registry.drained == set()
    registry.update({"a": 1, "b": 4})
    assert registry.usable(T0) == {"a": 1, "b": 4}


def test_undrain() -> None:
    registry = HostRegistry()
    registry.update({"a": 1, "b": 2})
    registry.drain("a")
    registry.drain("b")
    registry.undrain("a")
    registry.undrain("never-drained")
    assert registry.drained == {"b"}
    assert registry.usable(T0) == {"a": 1}


def test_drained_and_blacklisted_host_stays_out_after_undrain() -> None:
    registry = HostRegistry()
    registry.update({"a": 1, "b": 1})
    registry.drain("a")
    registry.blacklist("a", T0)
    registry.undrain("a")
    assert registry.usable(T0) == {"b": 1}


# --- capacity policy (driver/capacity.py) ------------------------------------------------------

def _config(**kw: object) -> DriverConfig:
    base: dict[str, object] = {"command": ("x",), "np": 4, "min_np": 4, "max_np": 4}
    base.update(kw)
    return DriverConfig(**base)  # type: ignore[arg-type]


def test_start_needs_np_slots_unless_elastic_and_waited_out() -> None:
    registry = HostRegistry()
    registry.update({"a": 2, "b": 1})
    fixed = _config(hosts=(("a", 2), ("b", 1)))
    assert start_refusal(fixed, 4, registry, waited_out=False) is None
    assert start_refusal(fixed, 3, registry, waited_out=False) == \
        "-np 4 needs 4 slots, but only 3 are available (hosts: a:2,b:1)"
    elastic = _config(min_np=2, max_np=None, hosts=(("a", 2), ("b", 1)))
    assert start_refusal(elastic, 3, registry, waited_out=False) is None
    dynamic = _config(min_np=2, max_np=None, discovery_script=Path("h.sh"))
    assert start_refusal(dynamic, 1, registry, waited_out=False) is None  # keeps waiting
    assert start_refusal(dynamic, 1, registry, waited_out=True) == (
        "-np 4 needs 4 slots, but only 1 are available after --start-timeout 30s "
        "(hosts: a:2,b:1)")
    nodes = _config(np=4, min_np=4, max_np=8, discovery="script:x", start_timeout=600.0,
                    torchrun=TorchrunSettings(nodes_of=2))  # --nnodes 2:4 --nproc-per-node 2
    assert start_refusal(nodes, 2, registry, waited_out=True) == (
        "--nnodes needs 2 node(s) of --nproc-per-node 2, but only 2 worker slot(s) joined "
        "within 600s (--rdzv-conf join_timeout) (nodes: a:2,b:1)")


def test_shortfall_is_hopeless_only_when_nothing_can_return() -> None:
    registry = HostRegistry(cooldown_range=(10.0, 10.0))
    registry.update({"a": 2, "b": 2})
    fixed = _config(min_np=2, hosts=(("a", 2), ("b", 2)))
    assert shortfall(fixed, 1, registry, now=0.0) == Shortfall(
        "only 1 slot(s) left, --min-np is 2", None)
    registry.blacklist("a", now=0.0)
    assert shortfall(fixed, 2, registry, now=1.0) == Shortfall(None, 10.0)  # a returns at 10
    dynamic = _config(min_np=2, discovery_script=Path("h.sh"))
    permanent = HostRegistry()
    permanent.update({"a": 2})
    assert shortfall(dynamic, 0, permanent, now=0.0) == Shortfall(None, None)  # hosts may come
    permanent.blacklist("a", now=0.0)
    assert shortfall(dynamic, 0, permanent, now=0.0) == Shortfall(
        "all hosts are blacklisted", None)
