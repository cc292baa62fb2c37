"""The Slurm cluster for these tests: built once per module, torn down after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.slurm.cluster import SlurmCluster, unavailable


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"the Slurm tests need a real cluster: {reason}")
    cluster = SlurmCluster.create(tmp_path_factory.mktemp("slurm"), n_nodes=3)
    try:
        yield cluster
    finally:
        cluster.destroy()
        left = cluster.namespaces()
        assert not any(ns in _namespaces() for ns in left), "a namespace was left"


def _namespaces() -> str:
    import subprocess
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
