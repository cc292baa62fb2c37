"""Request validation (elasticrun/driver/server/payload.py): every number from a request
finite and in range, every string and list bounded, checked before any conversion; and the
endpoints read a request's fields through it only."""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Any

import pytest

from elasticrun import protocol
from elasticrun.driver.server import payload as p
from elasticrun.driver.server.payload import BadRequest

HUGE = 10**400  # float() of it raises OverflowError
HANDLERS = ["kv.py", "rounds_api.py", "timeline_api.py", "results_api.py"]
SERVER = Path(p.__file__).parent


@pytest.mark.parametrize("value", [HUGE, -HUGE, 2**53 + 1, -1, True, 1.0, "1", None, [1],
                                   math.inf, math.nan])
def test_an_integer_out_of_range_or_of_another_type_is_a_bad_request(value: Any) -> None:
    with pytest.raises(BadRequest, match="'round'"):
        p.integer({"round": value}, "round")


def test_an_integer_takes_its_bounds_and_its_default() -> None:
    assert p.integer({"n": 0}, "n") == 0
    assert p.integer({"n": 2**53}, "n") == 2**53
    assert p.integer({"n": -1}, "n", -1) == -1
    assert p.integer({}, "n", default=7) == 7
    with pytest.raises(BadRequest, match="'n' is missing"):
        p.integer({}, "n")


@pytest.mark.parametrize("value", [HUGE, -HUGE, math.inf, -math.inf, math.nan, 1e11, -0.5,
                                   True, "1", None, {}])
def test_a_duration_out_of_range_or_not_finite_is_a_bad_request(value: Any) -> None:
    with pytest.raises(BadRequest, match="'waited_s'"):
        p.seconds({"waited_s": value}, "waited_s")


def test_a_number_takes_ints_and_floats_in_range_as_floats() -> None:
    assert p.seconds({"s": 3}, "s") == 3.0 and isinstance(p.seconds({"s": 3}, "s"), float)
    assert p.seconds({"s": p.MAX_SECONDS}, "s") == p.MAX_SECONDS
    assert p.maybe_seconds({}, "cpu") is None and p.maybe_seconds({"cpu": None}, "cpu") is None
    assert p.maybe_seconds({"cpu": 1.5}, "cpu") == 1.5


@pytest.mark.parametrize("timeout, held", [(0, 0.0), (5, 5.0), (3600, protocol.MAX_POLL_S),
                                           (p.MAX_TIMEOUT_S, protocol.MAX_POLL_S)])
def test_a_poll_timeout_is_held_at_most_max_poll_s(timeout: float, held: float) -> None:
    assert p.poll_timeout({"timeout": timeout}) == held
    assert p.poll_timeout({}) == 0.0


@pytest.mark.parametrize("timeout", [HUGE, -HUGE, math.inf, math.nan, -1, p.MAX_TIMEOUT_S + 1,
                                     "30", False])
def test_a_poll_timeout_out_of_range_is_a_bad_request(timeout: Any) -> None:
    with pytest.raises(BadRequest, match="'timeout'"):
        p.poll_timeout({"timeout": timeout})


@pytest.mark.parametrize("value", ["a" * (p.MAX_ID + 1), "\ud800", 1, None, ["a"]])
def test_a_bad_string_is_a_bad_request(value: Any) -> None:
    with pytest.raises(BadRequest, match="'worker_id'"):
        p.string({"worker_id": value}, "worker_id")


def test_strings_take_any_unicode_and_messages_are_cut() -> None:
    assert p.string({"w": "héllo ✓ 𝄞"}, "w") == "héllo ✓ 𝄞"
    assert p.text({"failure": "x" * 10_000}, "failure") == "x" * p.MAX_TEXT
    assert p.text({}, "failure", "") == ""


@pytest.mark.parametrize("keys", [["a"] * (p.MAX_KEYS + 1), ["a" * (p.MAX_ID + 1)], [1],
                                  ["\udfff"], "a", None])
def test_bad_keys_are_a_bad_request(keys: Any) -> None:
    with pytest.raises(BadRequest):
        p.keys({"keys": keys})


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, HUGE, 1.5, True])
def test_a_store_step_beyond_int64_is_a_bad_request(value: Any) -> None:
    with pytest.raises(BadRequest, match="'amount'"):
        p.amount({"amount": value})
    assert p.amount({"amount": 2**63 - 1}) == 2**63 - 1


def _event(ts: Any = 1.7e15, dur: Any = 5.0, args: Any = None) -> list[Any]:
    return ["X", "step", "train", ts, dur, 0, {} if args is None else args]


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": [value]}
    return value


@pytest.mark.parametrize("event, why", [
    (_event(ts=HUGE), "ts"), (_event(dur=-HUGE), "dur"), (_event(ts=math.inf), "ts"),
    (_event(dur=math.nan), "dur"), (_event(ts=-1), "ts"), (_event(dur=2.0**60), "dur"),
    (_event(args={"x": [math.nan]}), "finite"), (_event(args=_nested(20)), "deeper"),
])
def test_a_trace_event_out_of_range_is_a_bad_request(event: list[Any], why: str) -> None:
    with pytest.raises(BadRequest, match=why):
        p.trace_events({"events": [_event(), event]})


def test_trace_events_are_bounded_in_count_and_pass_when_well_formed() -> None:
    events = [_event(), _event(ts=0, dur=0, args=_nested(15)), ["i", "n", "c"]]
    assert p.trace_events({"events": events}) == events  # the shape: from_worker's to check
    assert p.trace_events({}) == []
    with pytest.raises(BadRequest, match="more than"):
        p.trace_events({"events": [[]] * (p.MAX_EVENTS + 1)})


def test_a_deep_value_is_refused_without_recursion() -> None:
    with pytest.raises(BadRequest, match="deeper"):
        p.plain_json(_nested(100_000), "args")


def _payload_names(tree: ast.AST) -> set[str]:
    """The names bound to `request[PAYLOAD]`, or to a nested object read through `p`."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            source = ast.unparse(node.value)
            if source == "request[PAYLOAD]" or source.startswith("p.obj("):
                names.add(node.targets[0].id)
    return names


@pytest.mark.parametrize("module", HANDLERS)
def test_the_endpoints_read_request_fields_through_payload_only(module: str) -> None:
    """A body is only passed to payload.py's accessors, or asked whether it has a field:
    never indexed, .get() or iterated by an endpoint (one place checks every value)."""
    tree = ast.parse((SERVER / module).read_text())
    names = _payload_names(tree) | {"body"}
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    misuse = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and node.id in names
                and isinstance(node.ctx, ast.Load)):
            continue
        parent = parents[node]
        passed = isinstance(parent, ast.Call) and node in parent.args \
            and ast.unparse(parent.func).startswith(("p.", "self._answered"))
        asked = isinstance(parent, ast.Compare) and all(
            isinstance(op, (ast.In, ast.NotIn)) for op in parent.ops)
        tested = isinstance(parent, ast.Compare) and isinstance(parent.ops[0], ast.Is)
        if not (passed or asked or tested):
            misuse.append(f"{module}:{node.lineno}: {ast.unparse(parent)}")
    assert misuse == []
