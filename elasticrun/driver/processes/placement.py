"""How workers and the driver reach each other: the driver address each host should dial,
and torchrun's MASTER_ADDR/MASTER_PORT."""

from __future__ import annotations

import socket

from elasticrun.config import DriverConfig
from elasticrun.driver.rounds.assignment import Assignment, hosts_in_rank_order
from elasticrun.launch.base import Launcher, is_local_host, local_names
from elasticrun.netif import address_towards, interface_address


class Placement:
    def __init__(self, config: DriverConfig, launcher: Launcher) -> None:
        self._config = config
        self._launcher = launcher
        self._local_names = local_names()
        self._addresses: dict[str, str] = {}
        self._known_hosts: list[str] = []
        self.all_local = False

    def set_hosts(self, hosts: list[str]) -> None:
        """The hosts known at start; decides whether the job is all local."""
        self._known_hosts = list(hosts)
        self.all_local = not self._config.dynamic_hosts and all(
            self.is_local(host) for host in hosts)

    def is_local(self, host: str) -> bool:
        return is_local_host(host, self._local_names)

    def address_for(self, host: str) -> str:
        """The driver's address as `host` should dial it: the launcher's answer if it has
        one (an agent dials the driver already), else loopback for all-local jobs, else the
        local address that routes to that host (or to the first remote host, for workers on
        this machine), or the --network-interface address."""
        launcher_address = getattr(self._launcher, "driver_address", None)
        if launcher_address is not None and (address := launcher_address(host)) is not None:
            return str(address)
        if self.all_local:
            return "127.0.0.1"
        if host not in self._addresses:
            address = interface_address(self._config.network_interface) \
                if self._config.network_interface else None
            if address is None:
                remote = host if not self.is_local(host) else next(
                    (h for h in self._known_hosts if not self.is_local(h)), None)
                try:
                    address = address_towards(remote, 22) if remote else _own_address()
                except OSError:
                    address = _own_address()
            self._addresses[host] = address
        return self._addresses[host]

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
            return "127.0.0.1", _free_port()
        if self.is_local(hosts[0]):
            return self.address_for(remote[0]), _free_port()
        return hosts[0], _free_port()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _own_address() -> str:
    try:
        return socket.gethostbyname(socket.getfqdn())
    except OSError:
        return "127.0.0.1"
