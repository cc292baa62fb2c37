"""elasticrun: elastic, fault-tolerant data-parallel training for PyTorch."""

from elasticrun.run import run  # light: the driver is imported when run() is called

__version__ = "0.1.0"

__all__ = ["run"]
