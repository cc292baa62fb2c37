"""The pause before a script's process group is destroyed (worker/gloo_teardown.py)."""

from __future__ import annotations

import atexit
import time

import pytest
import torch.distributed as dist

from elasticrun.worker import gloo_teardown


def test_destroy_process_group_waits_with_the_gil_released_then_destroys(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[object, ...]] = []
    monkeypatch.setattr(dist, "destroy_process_group", lambda *args: calls.append(args))
    registered: list[object] = []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(atexit, "unregister", registered.remove)
    gloo_teardown.settle_before_destroy()
    assert registered == [gloo_teardown.destroy_left_group]
    gloo_teardown.settle_before_destroy()  # once is enough: not wrapped twice
    started = time.monotonic()
    dist.destroy_process_group("group")
    assert calls == [("group",)]
    assert gloo_teardown.SETTLE_S <= time.monotonic() - started < 10 * gloo_teardown.SETTLE_S
    gloo_teardown.restore()  # a script that calls er.init(): as it was
    assert registered == []
    started = time.monotonic()
    dist.destroy_process_group("again")
    assert calls[-1] == ("again",) and time.monotonic() - started < gloo_teardown.SETTLE_S


def test_a_group_left_to_the_interpreters_end_is_destroyed_at_exit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(dist, "destroy_process_group", lambda: calls.append("destroyed"))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    gloo_teardown.destroy_left_group()
    assert calls == []  # the script destroyed it itself, or never had one
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    gloo_teardown.destroy_left_group()
    assert calls == ["destroyed"]
