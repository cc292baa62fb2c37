"""Worlds of 2 to 5 Gloo ranks, started once for this package's tests and shared by them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.collectives.world import GlooWorld

MAX_PROCESSES = 8  # this machine's limit for worker processes alive at once

_worlds: dict[int, GlooWorld] = {}  # in order of last use


def world_of(size: int) -> GlooWorld:
    world = _worlds.pop(size, None)
    if world is None:
        while _worlds and sum(_worlds) + size > MAX_PROCESSES:
            _worlds.pop(next(iter(_worlds))).close()  # the least recently used
        world = GlooWorld(size)
    _worlds[size] = world
    return world


@pytest.fixture(scope="package", autouse=True)
def _close_worlds() -> Iterator[None]:
    yield
    for world in _worlds.values():
        world.close()
    _worlds.clear()
