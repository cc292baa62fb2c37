"""`--discovery slurm[:SLOTS]`: the nodes of the Slurm allocation the driver runs in, less
those Slurm will not run work on now (drained, draining, down, failed, not responding).

So a node drained with `scontrol update nodename=N state=drain` leaves the job at its next
commit, as any host removed by discovery does, and one that comes back (resume) rejoins.
Slots per node: SLOTS, else ELASTICRUN_SLURM_SLOTS, else SLURM_NTASKS_PER_NODE when it is a
plain number, else --slots-per-host (1).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from elasticrun.discovery.base import HostSlots
from elasticrun.discovery.commands import run_command
from elasticrun.discovery.parsing import check_host
from elasticrun.discovery.plugins import DiscoveryOptions
from elasticrun.job.errors import ConfigError, DiscoveryError

# Node states (sinfo %T, long names) in which Slurm runs no new work on a node.
UNUSABLE = ("down", "drain", "fail", "maint", "reboot", "power", "future", "unknown")


def unusable(state: str) -> bool:
    """`state` as sinfo prints it (e.g. "mixed", "draining", "down*", "idle~")."""
    state = state.lower()
    return state.endswith(("*", "~", "#", "!", "%")) or state.startswith(UNUSABLE)


def node_states(sinfo_output: str) -> dict[str, str]:
    """`sinfo -h -N -o "%N %T"` -> {node: state}; a node listed twice (in two partitions)
    is unusable if any line says so."""
    states: dict[str, str] = {}
    for line in sinfo_output.splitlines():
        words = line.split()
        if len(words) == 2 and not unusable(states.get(words[0], "")):
            states[words[0]] = words[1]
    return states


class SlurmDiscovery:
    def __init__(self, slots: int, timeout: float, env: Mapping[str, str] | None = None) -> None:
        self._slots = slots
        self._timeout = timeout
        self._env = dict(os.environ if env is None else env)
        self._nodelist = self._env.get("SLURM_JOB_NODELIST") or self._env.get("SLURM_NODELIST")
        if not self._nodelist:
            raise ConfigError("slurm: not inside a Slurm allocation (SLURM_JOB_NODELIST is "
                              "not set): run elasticrun under sbatch or salloc")

    def describe(self) -> str:
        return f"Slurm allocation {self._nodelist}"

    async def find_hosts(self) -> HostSlots:
        assert self._nodelist is not None
        names = await run_command(["scontrol", "show", "hostnames", self._nodelist],
                                  self._timeout, "slurm: scontrol show hostnames", self._env)
        nodes = [line.strip() for line in names.splitlines() if line.strip()]
        for node in nodes:
            try:
                check_host(node)
            except ValueError:
                raise DiscoveryError(f"slurm: scontrol printed {node[:60]!r}, which is not a "
                                     f"host name") from None
        listing = await run_command(
            ["sinfo", "-h", "-N", "-n", self._nodelist, "-o", "%N %T"], self._timeout,
            "slurm: sinfo", self._env)
        states = node_states(listing)
        return {node: self._slots for node in dict.fromkeys(nodes)
                if node in states and not unusable(states[node])}


def slots_from(arg: str | None, env: Mapping[str, str], default: int) -> int:
    for name, text in (("slurm:SLOTS", arg), ("ELASTICRUN_SLURM_SLOTS",
                                              env.get("ELASTICRUN_SLURM_SLOTS"))):
        if text:
            if not re.fullmatch(r"[1-9][0-9]{0,3}", text.strip()):
                raise ConfigError(f"{name}: expected a whole number of slots 1..9999, "
                                  f"got {text!r}")
            return int(text)
    per_node = env.get("SLURM_NTASKS_PER_NODE", "")
    return int(per_node) if re.fullmatch(r"[1-9][0-9]{0,3}", per_node) else default


def plugin(options: DiscoveryOptions) -> SlurmDiscovery:
    return SlurmDiscovery(slots_from(options.arg, os.environ, options.slots_per_host),
                          options.timeout)
