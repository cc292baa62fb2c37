"""DistributedOptimizer (Horovod's `horovod.torch.optimizer` path)."""

from elasticrun.torch.optimizer.distributed import DistributedOptimizer

__all__ = ["DistributedOptimizer"]
