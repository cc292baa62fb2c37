"""Horovod's public module paths under elasticrun.torch hold the same objects as the
package, so `from horovod.torch.X import Y` becomes `from elasticrun.torch.X import Y`."""

from __future__ import annotations

import importlib

import pytest

import elasticrun.torch as er

PATHS = {
    "mpi_ops": ["init", "shutdown", "is_initialized", "rank", "size", "local_rank",
                "allreduce", "allreduce_async_", "grouped_allreduce", "allgather",
                "broadcast_", "alltoall", "reducescatter", "sparse_allreduce_async", "poll",
                "synchronize", "join", "barrier", "ProcessSet", "global_process_set",
                "add_process_set", "remove_process_set", "Average", "Sum", "Adasum",
                "Compression", "HorovodInternalError", "start_timeline", "stop_timeline"],
    "compression": ["Compression", "Compressor", "NoneCompressor", "FP16Compressor"],
    "functions": ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
                  "allgather_object"],
    "optimizer": ["DistributedOptimizer"],
    "sync_batch_norm": ["SyncBatchNorm"],
    "elastic": ["run", "ElasticSampler", "TorchState"],
    "elastic.sampler": ["ElasticSampler"],
    "elastic.state": ["TorchState", "ObjectState"],
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_horovods_module_path_holds_the_packages_objects(path: str) -> None:
    module = importlib.import_module(f"elasticrun.torch.{path}")
    for name in PATHS[path]:
        ours = getattr(module, name)
        face = getattr(er, name, None) or getattr(er.elastic, name, None)
        # (names Horovod keeps only in the module, such as Compressor, are checked there)
        assert face is None or ours is face, \
            f"elasticrun.torch.{path}.{name} is not elasticrun.torch's"


def test_everything_mpi_ops_exports_is_the_packages() -> None:
    module = importlib.import_module("elasticrun.torch.mpi_ops")
    assert len(module.__all__) > 50
    assert all(getattr(module, name) is getattr(er, name) for name in module.__all__)
