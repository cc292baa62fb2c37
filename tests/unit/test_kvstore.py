"""Unit tests for elasticrun.driver.kvstore.KVStore."""

from __future__ import annotations

import asyncio
import time

import pytest

from elasticrun.driver.server.kvstore import KVStore


@pytest.fixture
def store() -> KVStore:
    return KVStore()


# --------------------------------------------------------------------------- set / get


def test_set_get(store: KVStore) -> None:
    assert store.get("k") is None
    store.set("k", b"v1")
    assert store.get("k") == b"v1"
    store.set("k", b"v2")
    assert store.get("k") == b"v2"
    store.set("empty", b"")
    assert store.get("empty") == b""


# --------------------------------------------------------------------------- add


def test_add_creates_from_zero(store: KVStore) -> None:
    assert store.add("counter", 1) == 1
    assert store.get("counter") == b"1"


def test_add_accumulates_and_returns_int(store: KVStore) -> None:
    store.add("c", 5)
    result = store.add("c", 10)
    assert result == 15 and type(result) is int
    assert store.add("c", -20) == -5
    assert store.get("c") == b"-5"
    assert store.add("c", 0) == -5


def test_add_zero_on_missing_key_creates_it(store: KVStore) -> None:
    assert store.add("z", 0) == 0
    assert store.get("z") == b"0"


def test_add_reads_decimal_set_value(store: KVStore) -> None:
    store.set("c", b"41")
    assert store.add("c", 1) == 42
    assert store.get("c") == b"42"


def test_add_large_values_stored_as_ascii_decimal(store: KVStore) -> None:
    assert store.add("big", 2**62) == 2**62
    assert store.get("big") == str(2**62).encode("ascii")


@pytest.mark.parametrize("value", [b"abc", b"1.5", b"", b"\xff\xfe"])
def test_add_refuses_non_integer(store: KVStore, value: bytes) -> None:
    store.set("k", value)
    with pytest.raises(ValueError, match="does not hold an integer"):
        store.add("k", 1)
    assert store.get("k") == value  # unchanged


# --------------------------------------------------------------------------- compare_set


def test_compare_set_missing_key_empty_expected_sets(store: KVStore) -> None:
    assert store.compare_set("k", b"", b"new") == b"new"
    assert store.get("k") == b"new"


def test_compare_set_missing_key_nonempty_expected_returns_expected(store: KVStore) -> None:
    assert store.compare_set("k", b"old", b"new") == b"old"
    assert store.get("k") is None
    assert store.num_keys() == 0


def test_compare_set_match_sets(store: KVStore) -> None:
    store.set("k", b"old")
    assert store.compare_set("k", b"old", b"new") == b"new"
    assert store.get("k") == b"new"


def test_compare_set_mismatch_returns_current(store: KVStore) -> None:
    store.set("k", b"current")
    assert store.compare_set("k", b"other", b"new") == b"current"
    assert store.get("k") == b"current"


def test_compare_set_existing_empty_value(store: KVStore) -> None:
    store.set("k", b"")
    assert store.compare_set("k", b"", b"x") == b"x"
    assert store.get("k") == b"x"
    assert store.compare_set("k", b"", b"y") == b"x"


async def test_compare_set_wakes_waiters(store: KVStore) -> None:
    waiter = asyncio.create_task(store.wait(["k"], timeout=5.0))
    await asyncio.sleep(0.01)
    store.compare_set("k", b"", b"v")
    assert await asyncio.wait_for(waiter, 1.0) is True


# ---------------------------------------------------------------- check / delete / num_keys


def test_check(store: KVStore) -> None:
    assert store.check([]) is True
    assert store.check(["a"]) is False
    store.set("a", b"1")
    assert store.check(["a"]) is True
    assert store.check(["a", "b"]) is False
    store.set("b", b"")
    assert store.check(iter(["a", "b"])) is True


def test_delete(store: KVStore) -> None:
    store.set("a", b"1")
    assert store.delete("a") is True
    assert store.get("a") is None
    assert store.delete("a") is False
    assert store.delete("never") is False


def test_delete_key_holding_empty_value(store: KVStore) -> None:
    store.set("a", b"")
    assert store.delete("a") is True
    assert store.check(["a"]) is False


def test_num_keys_and_len(store: KVStore) -> None:
    assert store.num_keys() == 0 and len(store) == 0
    store.set("a", b"1")
    store.set("b", b"2")
    store.set("a", b"3")
    store.add("c", 1)
    assert store.num_keys() == 3 and len(store) == 3
    store.delete("b")
    assert store.num_keys() == 2


def test_delete_prefix_only_that_round(store: KVStore) -> None:
    for key in (
        "elasticrun/round1/a",
        "elasticrun/round1/b/c",
        "elasticrun/round10/a",
        "elasticrun/round2/a",
        "elasticrun/round1",
        "other",
    ):
        store.set(key, b"x")
    assert store.delete_prefix("elasticrun/round1/") == 2
    assert store.get("elasticrun/round1/a") is None
    assert store.get("elasticrun/round1/b/c") is None
    assert store.get("elasticrun/round10/a") == b"x"
    assert store.get("elasticrun/round2/a") == b"x"
    assert store.get("elasticrun/round1") == b"x"
    assert store.get("other") == b"x"
    assert store.num_keys() == 4
    assert store.delete_prefix("elasticrun/round1/") == 0


async def test_delete_prefix_wakes_waiters_who_then_time_out(store: KVStore) -> None:
    waiter = asyncio.create_task(store.wait(["elasticrun/round1/k"], timeout=0.3))
    await asyncio.sleep(0.01)
    store.delete_prefix("elasticrun/round1/")
    assert await asyncio.wait_for(waiter, 2.0) is False


async def test_delete_prefix_keeps_waiters_of_other_rounds(store: KVStore) -> None:
    waiter = asyncio.create_task(store.wait(["elasticrun/round10/k"], timeout=5.0))
    await asyncio.sleep(0.01)
    store.delete_prefix("elasticrun/round1/")
    await asyncio.sleep(0.01)
    assert not waiter.done()
    store.set("elasticrun/round10/k", b"v")
    assert await asyncio.wait_for(waiter, 1.0) is True


# --------------------------------------------------------------------------- wait


async def test_wait_existing_keys_returns_at_once(store: KVStore) -> None:
    store.set("a", b"1")
    assert await store.wait(["a"], timeout=0.0) is True
    assert await store.wait([], timeout=0.0) is True


async def test_wait_returns_as_soon_as_key_is_set(store: KVStore) -> None:
    async def setter() -> None:
        await asyncio.sleep(0.05)
        store.set("k", b"v")

    task = asyncio.create_task(setter())
    start = time.monotonic()
    assert await store.wait(["k"], timeout=10.0) is True
    elapsed = time.monotonic() - start
    assert 0.04 <= elapsed < 1.0
    await task


async def test_wait_times_out_when_key_never_appears(store: KVStore) -> None:
    start = time.monotonic()
    assert await store.wait(["never"], timeout=0.2) is False
    elapsed = time.monotonic() - start
    assert 0.18 <= elapsed < 1.5


async def test_wait_zero_timeout_missing_key(store: KVStore) -> None:
    assert await store.wait(["missing"], timeout=0.0) is False


async def test_wait_needs_all_keys(store: KVStore) -> None:
    waiter = asyncio.create_task(store.wait(["a", "b", "c"], timeout=5.0))
    store.set("b", b"1")
    await asyncio.sleep(0.02)
    assert not waiter.done()
    store.set("a", b"1")
    await asyncio.sleep(0.02)
    assert not waiter.done()
    store.set("c", b"1")
    assert await asyncio.wait_for(waiter, 1.0) is True


async def test_wait_all_keys_false_if_one_missing(store: KVStore) -> None:
    store.set("a", b"1")
    start = time.monotonic()
    assert await store.wait(["a", "b"], timeout=0.15) is False
    assert time.monotonic() - start < 1.0


async def test_wait_timeout_is_total_not_per_key(store: KVStore) -> None:
    async def setter() -> None:
        await asyncio.sleep(0.15)
        store.set("a", b"1")

    task = asyncio.create_task(setter())
    start = time.monotonic()
    # a arrives after 0.15 s; b never does. Total budget 0.25 s, not 0.25 s per key.
    assert await store.wait(["a", "b"], timeout=0.25) is False
    assert time.monotonic() - start < 0.4
    await task


async def test_wait_many_waiters_same_key(store: KVStore) -> None:
    waiters = [asyncio.create_task(store.wait(["k"], timeout=5.0)) for _ in range(5)]
    await asyncio.sleep(0.01)
    store.add("k", 1)
    results = await asyncio.wait_for(asyncio.gather(*waiters), 1.0)
    assert results == [True] * 5


async def test_wait_key_set_then_deleted_keeps_waiting(store: KVStore) -> None:
    waiter = asyncio.create_task(store.wait(["a", "b"], timeout=5.0))
    await asyncio.sleep(0.01)
    store.set("a", b"1")
    store.delete("a")  # before the waiter runs again
    store.set("b", b"1")
    await asyncio.sleep(0.02)
    assert not waiter.done()
    store.set("a", b"2")
    assert await asyncio.wait_for(waiter, 1.0) is True


async def test_wait_after_timeout_can_succeed_later(store: KVStore) -> None:
    assert await store.wait(["k"], timeout=0.05) is False
    waiter = asyncio.create_task(store.wait(["k"], timeout=5.0))
    await asyncio.sleep(0.01)
    store.set("k", b"v")
    assert await asyncio.wait_for(waiter, 1.0) is True
