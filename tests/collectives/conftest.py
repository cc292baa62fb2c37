"""Worlds of 2 to 5 Gloo ranks, started once per test session and shared by the tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.collectives.world import GlooWorld

_worlds: dict[int, GlooWorld] = {}


def world_of(size: int) -> GlooWorld:
    if size not in _worlds:
        _worlds[size] = GlooWorld(size)
    return _worlds[size]


@pytest.fixture(scope="session", autouse=True)
def _close_worlds() -> Iterator[None]:
    yield
    for world in _worlds.values():
        world.close()
    _worlds.clear()
