"""The pause before a script's process group is destroyed (worker/gloo_teardown.py)."""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from elasticrun.worker import gloo_teardown


def test_destroy_process_group_waits_with_the_gil_released_then_destroys(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[object, ...]] = []
    monkeypatch.setattr(dist, "destroy_process_group", lambda *args: calls.append(args))
    gloo_teardown.settle_before_destroy()
    gloo_teardown.settle_before_destroy()  # once is enough: not wrapped twice
    started = time.monotonic()
    dist.destroy_process_group("group")
    assert calls == [("group",)]
    assert gloo_teardown.SETTLE_S <= time.monotonic() - started < 10 * gloo_teardown.SETTLE_S
    gloo_teardown.restore()  # a script that calls er.init(): as it was
    started = time.monotonic()
    dist.destroy_process_group("again")
    assert calls[-1] == ("again",) and time.monotonic() - started < gloo_teardown.SETTLE_S
