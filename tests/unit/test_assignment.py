"""Unit tests for elasticrun.driver.rounds.assignment: hosts x slots -> stable ranks."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticrun.driver.rounds.assignment import (
    SlotId,
    assign,
    assign_keeping_state,
    hosts_in_rank_order,
    order_hosts,
)
from elasticrun.protocol import SlotInfo


def by_rank(result: dict[SlotId, SlotInfo]) -> list[tuple[SlotId, SlotInfo]]:
    return sorted(result.items(), key=lambda item: item[1].rank)


# --------------------------------------------------------------------------- SlotId


def test_slot_id_str_hash_and_order() -> None:
    slot = SlotId("node1", 2)
    assert str(slot) == "node1[2]"
    assert slot == SlotId("node1", 2)
    assert hash(slot) == hash(SlotId("node1", 2))
    assert SlotId("a", 1) < SlotId("a", 2) < SlotId("b", 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        slot.index = 3  # type: ignore[misc]


# --------------------------------------------------------------------------- assign


def test_assign_fills_host_by_host() -> None:
    result = assign([("a", 2), ("b", 3)])
    assert [(str(s), i.rank) for s, i in by_rank(result)] == [
        ("a[0]", 0),
        ("a[1]", 1),
        ("b[0]", 2),
        ("b[1]", 3),
        ("b[2]", 4),
    ]
    for slot, info in result.items():
        assert info.hostname == slot.host
        assert info.local_rank == slot.index
        assert info.size == 5
    assert {i.local_size for s, i in result.items() if s.host == "a"} == {2}
    assert {i.local_size for s, i in result.items() if s.host == "b"} == {3}


def test_assign_uneven_hosts_cross_rank_and_size() -> None:
    result = assign([("a", 2), ("b", 1), ("c", 3)])
    got = {
        str(s): (i.rank, i.local_rank, i.local_size, i.cross_rank, i.cross_size)
        for s, i in result.items()
    }
    assert got == {
        # local_rank 0 exists on a, b, c -> cross_size 3
        "a[0]": (0, 0, 2, 0, 3),
        "b[0]": (2, 0, 1, 1, 3),
        "c[0]": (3, 0, 3, 2, 3),
        # local_rank 1 exists on a, c -> cross_size 2
        "a[1]": (1, 1, 2, 0, 2),
        "c[1]": (4, 1, 3, 1, 2),
        # local_rank 2 exists on c only
        "c[2]": (5, 2, 3, 0, 1),
    }
    assert {i.size for i in result.values()} == {6}


def test_assign_single_host() -> None:
    result = assign([("localhost", 4)])
    assert [i.rank for _, i in by_rank(result)] == [0, 1, 2, 3]
    assert all(i.cross_rank == 0 and i.cross_size == 1 for i in result.values())
    assert all(i.local_size == 4 and i.size == 4 for i in result.values())


def test_assign_max_size_caps_later_hosts() -> None:
    result = assign([("a", 2), ("b", 3), ("c", 2)], max_size=4)
    assert sorted(map(str, result)) == ["a[0]", "a[1]", "b[0]", "b[1]"]
    assert {i.size for i in result.values()} == {4}
    b_infos = [i for s, i in result.items() if s.host == "b"]
    assert {i.local_size for i in b_infos} == {2}
    # c got nothing, so it is no cross peer either.
    assert result[SlotId("a", 0)].cross_size == 2
    assert result[SlotId("b", 1)].cross_rank == 1


def test_assign_max_size_smaller_than_first_host() -> None:
    result = assign([("a", 4), ("b", 4)], max_size=3)
    assert sorted(map(str, result)) == ["a[0]", "a[1]", "a[2]"]
    assert all(i.local_size == 3 and i.size == 3 and i.cross_size == 1 for i in result.values())


def test_assign_max_size_larger_than_total_is_no_cap() -> None:
    assert assign([("a", 2), ("b", 1)], max_size=100) == assign([("a", 2), ("b", 1)])


@pytest.mark.parametrize("max_size", [0, -1])
def test_assign_max_size_zero_or_less_gives_nothing(max_size: int) -> None:
    assert assign([("a", 2)], max_size=max_size) == {}


def test_assign_skips_zero_slot_hosts() -> None:
    result = assign([("a", 0), ("b", 2), ("c", 0), ("d", 1)])
    assert {s.host for s in result} == {"b", "d"}
    assert result[SlotId("b", 0)].rank == 0
    assert result[SlotId("d", 0)].rank == 2
    assert result[SlotId("d", 0)].cross_rank == 1
    assert result[SlotId("d", 0)].cross_size == 2


def test_assign_negative_slots_count_as_zero() -> None:
    result = assign([("a", -3), ("b", 1)])
    assert list(result) == [SlotId("b", 0)]
    assert result[SlotId("b", 0)].size == 1


def test_assign_empty() -> None:
    assert assign([]) == {}
    assert assign([("a", 0)]) == {}


def test_assign_host_order_decides_ranks() -> None:
    first = assign([("a", 1), ("b", 1)])
    second = assign([("b", 1), ("a", 1)])
    assert first[SlotId("a", 0)].rank == 0
    assert second[SlotId("a", 0)].rank == 1


# --------------------------------------------------------------------------- order_hosts


def test_order_hosts_previous_first_then_new() -> None:
    assert order_hosts(["b", "a"], ["a", "c", "b", "d"]) == ["b", "a", "c", "d"]


def test_order_hosts_drops_vanished() -> None:
    assert order_hosts(["a", "b", "c"], ["c", "a"]) == ["a", "c"]


def test_order_hosts_no_previous_keeps_given_order() -> None:
    assert order_hosts([], ["z", "y", "x"]) == ["z", "y", "x"]


def test_order_hosts_accepts_iterables() -> None:
    assert order_hosts(("a",), iter(["b", "a"])) == ["a", "b"]
    assert order_hosts(["a"], {"b": 1, "a": 2}) == ["a", "b"]


def test_order_hosts_nothing_available() -> None:
    assert order_hosts(["a", "b"], []) == []


# --------------------------------------------------------------------------- hosts_in_rank_order


def test_hosts_in_rank_order() -> None:
    result = assign([("c", 1), ("a", 2), ("b", 0), ("d", 1)])
    assert hosts_in_rank_order(result) == ["c", "a", "d"]
    assert hosts_in_rank_order({}) == []


def test_hosts_in_rank_order_ignores_dict_order() -> None:
    result = assign([("x", 2), ("y", 1)])
    reversed_dict = dict(reversed(list(result.items())))
    assert hosts_in_rank_order(reversed_dict) == ["x", "y"]


# --------------------------------------------------------------------------- properties

_NAMES = st.text(alphabet="abcdefgh", min_size=1, max_size=3)
_HOSTS = st.dictionaries(_NAMES, st.integers(min_value=0, max_value=6), max_size=8).map(
    lambda d: list(d.items())
)
_MAX = st.one_of(st.none(), st.integers(min_value=0, max_value=40))


def _check_invariants(
    hosts: list[tuple[str, int]], max_size: int | None, result: dict[SlotId, SlotInfo]
) -> None:
    total = sum(max(s, 0) for _, s in hosts)
    expected_size = total if max_size is None else max(0, min(total, max_size))
    assert len(result) == expected_size
    assert sorted(i.rank for i in result.values()) == list(range(len(result)))
    assert all(i.size == len(result) for i in result.values())
    per_host: dict[str, list[SlotInfo]] = {}
    for slot, info in result.items():
        assert info.hostname == slot.host and info.local_rank == slot.index
        per_host.setdefault(slot.host, []).append(info)
    slots_of = dict(hosts)
    for host, infos in per_host.items():
        local_size = infos[0].local_size
        assert 0 < local_size <= slots_of[host]
        assert sorted(i.local_rank for i in infos) == list(range(local_size))
        assert all(i.local_size == local_size for i in infos)
        ranks = sorted(i.rank for i in infos)
        assert ranks == list(range(ranks[0], ranks[0] + local_size))  # contiguous
    # Hosts appear in rank order exactly in the given order.
    assert hosts_in_rank_order(result) == [h for h, _ in hosts if h in per_host]
    # cross_rank / cross_size: the hosts that have this local rank, in host order.
    for info in result.values():
        peers = [
            h for h, _ in hosts if h in per_host and per_host[h][0].local_size > info.local_rank
        ]
        assert info.cross_size == len(peers)
        assert info.cross_rank == peers.index(info.hostname)


@given(hosts=_HOSTS, max_size=_MAX)
@settings(max_examples=300)
def test_property_assign_invariants(hosts: list[tuple[str, int]], max_size: int | None) -> None:
    _check_invariants(hosts, max_size, assign(hosts, max_size))


@given(old=_HOSTS, extra=_HOSTS, max_size=_MAX)
@settings(max_examples=300)
def test_property_appending_hosts_keeps_ranks(
    old: list[tuple[str, int]], extra: list[tuple[str, int]], max_size: int | None
) -> None:
    before = assign(old, max_size)
    old_slots = dict(old)
    available = dict(old)
    for host, slots in extra:
        available.setdefault(host, slots)  # only new hosts are added
    ordered = order_hosts([h for h, _ in old], available)
    after = assign([(h, available[h]) for h in ordered], max_size)
    assert ordered[: len(old)] == [h for h, _ in old]
    assert available == {**old_slots, **{h: s for h, s in extra if h not in old_slots}}
    for slot, info in before.items():
        assert slot in after
        assert after[slot].rank == info.rank
        assert after[slot].local_rank == info.local_rank


@given(
    old=_HOSTS,
    changes=st.lists(st.one_of(st.none(), st.integers(min_value=0, max_value=6)), max_size=8),
    extra=_HOSTS,
    max_size=_MAX,
)
@settings(max_examples=300)
def test_property_ranks_stable_while_earlier_hosts_unchanged(
    old: list[tuple[str, int]],
    changes: list[int | None],
    extra: list[tuple[str, int]],
    max_size: int | None,
) -> None:
    """A slot keeps its rank when every host before it kept the same number of slots
    (vanished hosts count as having none) and its own host still has the slot."""
    before = assign(old, max_size)
    available: dict[str, int] = {}
    for index, (host, slots) in enumerate(old):
        change = changes[index] if index < len(changes) else slots
        if change is not None:  # None: the host vanished
            available[host] = change
    for host, slots in extra:
        available.setdefault(host, slots)
    ordered = order_hosts(hosts_in_rank_order(before), available)
    after = assign([(h, available[h]) for h in ordered], max_size)

    def taken(result: dict[SlotId, SlotInfo], host: str) -> int:
        return sum(1 for s in result if s.host == host)

    for slot, info in before.items():
        earlier = hosts_in_rank_order(before)
        earlier = earlier[: earlier.index(slot.host)]
        if all(taken(before, h) == taken(after, h) for h in earlier) and slot in after:
            assert after[slot].rank == info.rank


def test_keeping_state_changes_nothing_while_a_holder_stays() -> None:
    hosts = [("a", 2), ("c", 2)]
    holders = [SlotId("a", 0), SlotId("a", 1), SlotId("b", 0)]
    assert assign_keeping_state(hosts, None, holders) == assign(hosts)


def test_keeping_state_when_every_host_is_replaced() -> None:
    holders = [SlotId("old", 0), SlotId("old", 1)]
    handover = assign_keeping_state([("new", 2)], None, holders)
    assert {slot: info.rank for slot, info in handover.items()} == {
        SlotId("old", 0): 0, SlotId("new", 0): 1, SlotId("new", 1): 2}
    # The round after: the new workers hold the state, the keeper goes.
    assert assign_keeping_state([("new", 2)], None, list(handover)) == assign([("new", 2)])


def test_keeping_state_respects_max_size() -> None:
    handover = assign_keeping_state([("new", 4)], 2, [SlotId("old", 0)])
    assert sorted(handover) == [SlotId("new", 0), SlotId("old", 0)]
    assert handover[SlotId("old", 0)].rank == 0


def test_keeping_state_without_holders_is_plain_assignment() -> None:
    assert assign_keeping_state([("new", 2)], None, []) == assign([("new", 2)])


def test_a_host_started_afresh_never_takes_rank_0_from_a_survivor() -> None:
    """b's workers survived; a's died and a came back (cooldown over) with new workers."""
    hosts = [("a", 1), ("b", 1), ("c", 2)]  # the previous round's order: a, b; then c
    assignment = assign_keeping_state(hosts, None, [SlotId("b", 0)])
    assert {slot: info.rank for slot, info in assignment.items()} == {
        SlotId("b", 0): 0, SlotId("a", 0): 1, SlotId("c", 0): 2, SlotId("c", 1): 3}


def test_survivors_keep_their_order() -> None:
    hosts = [("a", 2), ("b", 2), ("c", 2)]
    holders = [SlotId("b", 0), SlotId("b", 1), SlotId("c", 0), SlotId("c", 1)]
    assignment = assign_keeping_state(hosts, None, holders)
    assert [s.host for s, _ in sorted(assignment.items(), key=lambda i: i[1].rank)] == \
        ["b", "b", "c", "c", "a", "a"]


def test_a_leaving_keeper_hands_over_when_no_survivor_holds_the_state() -> None:
    """b survives but has no state yet; a is leaving but holds it: a stays as rank 0."""
    assignment = assign_keeping_state([("b", 1)], None, [SlotId("b", 0)],
                                      keepers=[SlotId("a", 0)])
    assert {slot: info.rank for slot, info in assignment.items()} == {
        SlotId("a", 0): 0, SlotId("b", 0): 1}
