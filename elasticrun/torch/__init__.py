"""The worker API, mirroring horovod.torch: `import elasticrun.torch as hvd` runs a Horovod
script unchanged. Names Horovod has and elasticrun does not raise NotSupportedError saying
why (never AttributeError)."""

from typing import Any

from elasticrun.job.errors import NotSupportedError
from elasticrun.torch import elastic
from elasticrun.torch.builds import (
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    is_homogeneous,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
)
from elasticrun.torch.collectives.allgather import (
    allgather,
    allgather_async,
    grouped_allgather,
    grouped_allgather_async,
    sparse_allreduce_async,
)
from elasticrun.torch.collectives.allreduce import (
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
)
from elasticrun.torch.collectives.alltoall import alltoall, alltoall_async
from elasticrun.torch.collectives.barrier import barrier
from elasticrun.torch.collectives.broadcast import (
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
)
from elasticrun.torch.collectives.handles import poll, synchronize
from elasticrun.torch.collectives.join import join
from elasticrun.torch.collectives.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    init_process_sets,
    remove_process_set,
)
from elasticrun.torch.collectives.reduce_ops import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
)
from elasticrun.torch.collectives.reducescatter import (
    grouped_reducescatter,
    grouped_reducescatter_async,
    reducescatter,
    reducescatter_async,
)
from elasticrun.torch.compression import Compression
from elasticrun.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from elasticrun.torch.hsdp import (
    num_replicas,
    replica_rank,
    replicate,
    shard_mesh,
    shard_rank,
    shard_size,
)
from elasticrun.torch.optimizer import DistributedOptimizer
from elasticrun.torch.sync_batch_norm import SyncBatchNorm
from elasticrun.torch.world import runtime
from elasticrun.torch.world.place import (
    cross_rank,
    cross_size,
    local_rank,
    local_size,
    rank,
    size,
)
from elasticrun.torch.world.plane import process_group_for
from elasticrun.torch.world.runtime import is_initialized, shutdown
from elasticrun.worker.elastic import CollectiveMismatchError, WorkersFailedError
from elasticrun.worker.timeline import start_timeline, stop_timeline

# Horovod's collectives raise HorovodInternalError when a peer fails; elasticrun's raise
# WorkersFailedError, which elastic.run treats the same way.
HorovodInternalError = WorkersFailedError

_NOT_SUPPORTED = {
    "mpi_lib": "horovod.torch.mpi_lib is Horovod's compiled extension; elasticrun has none",
    "mpi_lib_v2": "horovod.torch.mpi_lib_v2 is Horovod's compiled extension; elasticrun has "
                  "none",
}


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Joins the job; blocks until this worker's round is complete (after shutdown(), the
    round after the one it left). `process_sets`: Horovod's static process sets, a list of
    ProcessSet (or "dynamic", accepted: add_process_set always works), in jobs that are not
    elastic. Horovod's `comm` (an MPI communicator) is refused: elasticrun has no MPI."""
    if comm is not None:
        raise NotSupportedError("init(comm=...): elasticrun has no MPI and always uses every "
                                "rank of the current round")
    runtime.init()
    if process_sets not in (None, "dynamic"):
        init_process_sets(list(process_sets))


def __getattr__(name: str) -> Any:
    if name in _NOT_SUPPORTED:
        raise NotSupportedError(f"{name}: {_NOT_SUPPORTED[name]}")
    raise AttributeError(f"module 'elasticrun.torch' has no attribute {name!r}")


__all__ = [
    "Adasum", "Average", "CollectiveMismatchError", "Compression", "DistributedOptimizer",
    "HorovodInternalError", "Max",
    "Min", "ProcessSet", "Product", "ReduceOp", "Sum", "SyncBatchNorm", "add_process_set",
    "allgather", "allgather_async", "allgather_object", "allreduce", "allreduce_",
    "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async", "barrier",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "broadcast_object",
    "broadcast_optimizer_state", "broadcast_parameters", "ccl_built", "cross_rank",
    "cross_size", "cuda_built", "ddl_built", "elastic", "gloo_built", "gloo_enabled",
    "global_process_set", "grouped_allgather", "grouped_allgather_async",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "grouped_reducescatter", "grouped_reducescatter_async",
    "init", "is_homogeneous", "is_initialized", "join", "local_rank", "local_size",
    "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "num_replicas", "poll",
    "process_group_for", "rank", "reducescatter", "reducescatter_async", "remove_process_set",
    "replica_rank", "replicate", "rocm_built", "shard_mesh", "shard_rank", "shard_size", "shutdown",
    "size", "sparse_allreduce_async", "start_timeline", "stop_timeline", "synchronize",
]
