"""One exception tree for everything elasticrun raises on purpose."""

from __future__ import annotations


class ElasticrunError(Exception):
    """Base class. Its message is shown to the user as one line, without a traceback."""


class ConfigError(ElasticrunError):
    """A setting or an input (flag, hostfile, config value) is invalid."""


class DiscoveryError(ElasticrunError):
    """Host discovery failed: the script is missing, failed, hung or printed garbage."""


class SpawnError(ElasticrunError):
    """A worker process could not be started."""


class JobFailedError(ElasticrunError):
    """The job cannot make progress; the message names the root cause."""


class NotSupportedError(ElasticrunError, NotImplementedError):
    """A Horovod feature elasticrun does not provide; the message names it and says why."""
