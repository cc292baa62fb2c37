"""Where workers run and how they are reached: the spawner for each host (subprocess or
SSH), the driver address each host should dial, and torchrun's MASTER_ADDR/MASTER_PORT."""

from __future__ import annotations

import socket
import sys

from elasticrun.config import DriverConfig
from elasticrun.driver.rounds.assignment import Assignment
from elasticrun.netif import address_towards, interface_address
from elasticrun.spawn.base import Spawner, is_local_host, local_names
from elasticrun.spawn.local import LocalSpawner
from elasticrun.spawn.ssh import SSHSettings, SSHSpawner


class Placement:
    def __init__(self, config: DriverConfig) -> None:
        self._config = config
        self._local_names = local_names()
        self._local_spawner = LocalSpawner()
        self._ssh_spawner: SSHSpawner | None = None
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

    def spawner_for(self, host: str) -> Spawner:
        """Local hosts run subprocesses; every other host is reached over SSH."""
        if self.is_local(host):
            return self._local_spawner
        if self._ssh_spawner is None:
            config = self._config
            self._ssh_spawner = SSHSpawner(SSHSettings(
                port=config.ssh_port,
                identity_file=config.ssh_identity_file,
                accept_new_host_keys=config.ssh_accept_new_host_keys,
                python=config.remote_python or sys.executable,
                connect_timeout=min(10.0, config.start_timeout),
                stop_grace_period=config.stop_grace_period,
            ))
        return self._ssh_spawner

    def address_for(self, host: str) -> str:
        """The driver's address as `host` should dial it: loopback for all-local jobs,
        else the local address that routes to that host (or to the first remote host,
        for workers on this machine), or the --network-interface address."""
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
        """MASTER_ADDR/MASTER_PORT for torchrun-style scripts: rank 0's host, a free port."""
        rank0 = min(assignment.items(), key=lambda item: item[1].rank)[0].host
        if self.is_local(rank0):
            return "127.0.0.1", _free_port()
        return rank0, _free_port()

    async def close(self) -> None:
        if self._ssh_spawner is not None:
            await self._ssh_spawner.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _own_address() -> str:
    try:
        return socket.gethostbyname(socket.getfqdn())
    except OSError:
        return "127.0.0.1"
