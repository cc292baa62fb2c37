"""elasticrun: elastic, fault-tolerant data-parallel training for PyTorch."""

# The package's one version: pyproject.toml reads it from this line's text (no import).
__version__ = "0.1.0"

from elasticrun.api.run import run  # noqa: E402  light: the driver is imported when run() is called

__all__ = ["run"]
