"""How workers and the driver reach each other: the driver address each host should dial,
and torchrun's MASTER_ADDR/MASTER_PORT.

Nothing here waits for a name to resolve: host names are looked up in the background
(lookups.HostLookups), the spawn of a worker awaits only its own host's lookup (ready()),
and until a lookup has ended address_for() answers loopback, where the server always
listens, without keeping that answer."""

from __future__ import annotations

import socket
from collections.abc import Sequence

from elasticrun.driver.processes.lookups import HostLookups, Pending
from elasticrun.driver.rounds.assignment import Assignment, hosts_in_rank_order
from elasticrun.job.config import DriverConfig
from elasticrun.launch.base import Launcher, is_local_host, local_names
from elasticrun.system.netif import address_towards, interface_address

LOOPBACK = "127.0.0.1"


class Placement:
    def __init__(self, config: DriverConfig, launcher: Launcher,
                 lookups: HostLookups | None = None) -> None:
        self._config = config
        self._launcher = launcher
        self._local_names = local_names()
        self._lookups = lookups or HostLookups()
        self._addresses: dict[str, str] = {}
        self._first_remote: str | None = None
        self._round: tuple[Sequence[str], str | None] = ((), None)  # its first remote host
        self.all_local = False

    def set_hosts(self, hosts: list[str]) -> None:
        """The hosts known at start; decides whether the job is all local, and starts
        looking up the names of the others (in a running loop)."""
        remote = [host for host in hosts if not self.is_local(host)]
        self._first_remote = remote[0] if remote else None
        self.all_local = not self._config.dynamic_hosts and not remote
        if not self.all_local:
            self._lookups.start([*(h for h in remote if not self._placed(h)),
                                 socket.gethostname()])

    async def ready(self, host: str, round_hosts: Sequence[str] = ()) -> None:
        """Waits (each lookup bounded) until address_for(host) and master_endpoint() of a
        round of `round_hosts` (in rank order; the same list for each worker of a round:
        it is scanned once) answer for good."""
        if self.all_local:
            return
        if round_hosts is not self._round[0]:
            self._round = (round_hosts, next(
                (h for h in round_hosts if not self.is_local(h)), None))
        needed = [host if not self.is_local(host) else self._first_remote,
                  self._round[1], socket.gethostname()]
        for name in dict.fromkeys(name for name in needed if name is not None):
            if not self._placed(name):
                await self._lookups.address(name)

    def is_local(self, host: str) -> bool:
        return is_local_host(host, self._local_names)

    def _placed(self, host: str) -> bool:
        """The launcher knows where `host` is (an agent's connection says it): its name,
        which may be no host name at all (torchrun's nodes: a launcher's), is not looked
        up."""
        where = getattr(self._launcher, "host_address", None)
        return where is not None and where(host) is not None

    def address_for(self, host: str) -> str:
        """The driver's address as `host` should dial it: the launcher's answer if it has
        one (an agent dials the driver already), else loopback for all-local jobs, else the
        local address that routes to that host (or to the first remote host, for workers on
        this machine), or the --network-interface address."""
        launcher_address = getattr(self._launcher, "driver_address", None)
        if launcher_address is not None and (address := launcher_address(host)) is not None:
            return str(address)
        if self.all_local:
            return LOOPBACK
        if host not in self._addresses:
            address = interface_address(self._config.network_interface) \
                if self._config.network_interface else None
            if address is None:
                address = self._routed_address(host)
            if address is None:  # a lookup has not ended
                return LOOPBACK
            self._addresses[host] = address
        return self._addresses[host]

    def _routed_address(self, host: str) -> str | None:
        """The local address that routes to `host` (to the first remote host, for this
        machine), else this machine's own; None while a lookup it needs has not ended."""
        remote = host if not self.is_local(host) else self._first_remote
        if remote is not None:
            found = self._lookups.known(remote)
            if isinstance(found, Pending):
                self._lookups.start([remote])
                return None
            if found is not None:
                try:
                    return address_towards(found, 22)
                except OSError:
                    pass
        own = self._lookups.known(socket.gethostname())
        if isinstance(own, Pending):
            self._lookups.start([socket.gethostname()])
            return None
        return own or LOOPBACK

    def master_endpoint(self, assignment: Assignment) -> tuple[str, int]:
        """MASTER_ADDR/MASTER_PORT for torchrun-style scripts (rank 0 runs its TCPStore
        there): where every host of the round reaches rank 0's host, and a free port. The
        launcher's word first (an agent's host is where its connection comes from); a round
        all on this machine uses loopback; this machine as rank 0's host of a round across
        machines, the address the others dial the driver at."""
        hosts = hosts_in_rank_order(assignment)
        where = getattr(self._launcher, "host_address", None)
        address = where(hosts[0]) if where is not None else None
        if address is not None:
            return address, _free_port()
        remote = [host for host in hosts if not self.is_local(host)]
        if not remote:
            return LOOPBACK, _free_port()
        if self.is_local(hosts[0]):
            return self.address_for(remote[0]), _free_port()
        return hosts[0], _free_port()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])

