"""Worlds of 2 to 5 Gloo ranks, started once for this package's tests and shared by them.

Under pytest-xdist (`--dist loadgroup`) the package's tests run on one pytest worker, so
that the worlds start once rather than once per worker: each rank imports torch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.collectives.world import GlooWorld

MAX_PROCESSES = 8  # this machine's limit for worker processes alive at once

_worlds: dict[int, GlooWorld] = {}  # in order of last use
_PACKAGE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's hook reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(_PACKAGE):
            item.add_marker(pytest.mark.xdist_group("gloo-worlds"))


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
