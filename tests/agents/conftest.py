"""Fixtures of the agent tests: every job a test starts is killed at its end, whatever
happened (driver, agents and workers, by the job's tag)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.agents.harness import AgentJob


@pytest.fixture
def jobs() -> Iterator[list[AgentJob]]:
    started: list[AgentJob] = []
    yield started
    for job in started:
        job.kill_all()
