"""Pure: whether a job can start or go on with the slots it has, and if not, why."""

from __future__ import annotations

from dataclasses import dataclass

from elasticrun.discovery.parsing import format_hosts
from elasticrun.driver.hosts.registry import HostRegistry
from elasticrun.job.config import DriverConfig


def start_refusal(config: DriverConfig, available: int, registry: HostRegistry,
                  waited_out: bool) -> str | None:
    """Why the job cannot start with `available` slots (None: start, or keep waiting).

    It starts with -np slots; an elastic job also with --min-np once it may wait no longer
    (the start timeout passed, or the hosts cannot change)."""
    if available >= config.np:
        return None
    if config.dynamic_hosts and not waited_out:
        return None
    if config.elastic and available >= config.min_np:
        return None
    hosts = format_hosts(registry.discovered) or "none"
    per_node = config.torchrun.nodes_of
    if per_node:  # torchrun's multi-node form speaks of nodes
        return (f"--nnodes needs {config.np // per_node} node(s) of --nproc-per-node "
                f"{per_node}, but only {available} worker slot(s) joined within "
                f"{config.start_timeout:g}s (--rdzv-conf join_timeout) (nodes: {hosts})")
    waited = f" after --start-timeout {config.start_timeout:g}s" if config.dynamic_hosts else ""
    return (f"-np {config.np} needs {config.np} slots, but only {available} are available"
            f"{waited} (hosts: {hosts})")


@dataclass(frozen=True)
class Shortfall:
    """Fewer than --min-np slots: either hopeless (`hopeless` says why), or worth waiting
    for, at most until `wake_at` (when a blacklisted host returns; None: a host change)."""

    hopeless: str | None
    wake_at: float | None


def shortfall(config: DriverConfig, slots: int, registry: HostRegistry, now: float,
              trained: bool = True) -> Shortfall:
    """`trained`: some worker of the job has worked. Until one has, a blacklisted slot or
    host is not waited for: what failed is most likely the job's own set-up (a missing
    command, an import error, a bad flag), which a cooldown does not mend."""
    discovered = registry.discovered
    returning = registry.next_cooldown_end(now) if trained else None
    all_blacklisted = bool(discovered) and all(registry.is_blacklisted(h, now)
                                               for h in discovered)
    if returning is None and (not config.dynamic_hosts or all_blacklisted):
        why = "all hosts are blacklisted" if all_blacklisted else (
            f"only {slots} slot(s) left, --min-np is {config.min_np}")
        return Shortfall(why, None)
    return Shortfall(None, returning)
