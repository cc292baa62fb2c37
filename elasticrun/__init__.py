"""elasticrun: elastic, fault-tolerant data-parallel training for PyTorch."""

__version__ = "0.1.0"
