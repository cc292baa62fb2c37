"""The worker API, mirroring horovod.torch: `import elasticrun.torch as er`."""

from elasticrun.torch import elastic
from elasticrun.torch.ops import (
    Average,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
    allgather_object,
    allreduce,
    allreduce_,
    broadcast,
    broadcast_,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
    cross_rank,
    cross_size,
    grouped_allreduce_,
    local_rank,
    local_size,
    rank,
    size,
)
from elasticrun.torch.optimizer import DistributedOptimizer
from elasticrun.torch.runtime import init, is_initialized, shutdown

__all__ = [
    "Average", "Max", "Min", "Product", "ReduceOp", "Sum",
    "DistributedOptimizer",
    "allgather_object", "allreduce", "allreduce_", "broadcast", "broadcast_",
    "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters",
    "cross_rank", "cross_size", "elastic", "grouped_allreduce_", "init", "is_initialized",
    "local_rank", "local_size", "rank", "shutdown", "size",
]
