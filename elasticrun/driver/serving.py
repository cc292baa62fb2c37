"""Where the driver serves: the addresses it listens on and that each host dials, its worker
server started there (a resumed driver's on its predecessor's port), and the lines that tell
the user where to reach it.

Which addresses those are is decided in server/listen.py; this applies it to the job's hosts.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from aiohttp import web

from elasticrun.driver.processes.placement import Placement
from elasticrun.driver.server.app import WorkerServer
from elasticrun.driver.server.listen import (
    covered,
    dial_address,
    listen_addresses,
    wildcard_warning,
)
from elasticrun.job.config import DriverConfig
from elasticrun.job.errors import ConfigError

log = logging.getLogger("elasticrun.driver")  # the driver's own lines

RESUME_PORT_WAIT_S = 10.0  # the old driver's port may be freed a moment after its death


@dataclass(frozen=True)
class Addresses:
    dialed: list[str]  # how each host dials the driver, this one's ("localhost") first
    listening: list[str]  # where the driver's server listens


def addresses_for(config: DriverConfig, placement: Placement,
                  hosts: Iterable[str]) -> Addresses:
    dialed = [dial_address(config.bind, placement.address_for(host))
              for host in ["localhost", *hosts]]
    return Addresses(dialed, listen_addresses(config.bind, placement.all_local, dialed))


async def serve(server: WorkerServer, config: DriverConfig, addresses: Addresses, port: int,
                routes: Iterable[web.RouteDef], resumed: bool) -> int:
    """Starts `server` on `port` (0: any) and returns its port; one it cannot listen on is
    a ConfigError."""
    try:
        listening = None if config.listen_fd is None else socket.socket(
            fileno=config.listen_fd)
        return await server.start(addresses.listening, port, routes,
                                  RESUME_PORT_WAIT_S if resumed else 0.0, listening)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {', '.join(addresses.listening)} port "
                          f"{port}: {exc.strerror or exc}") from None


def announce(config: DriverConfig, job_id: str, addresses: Addresses, port: int) -> None:
    """Says where agents connect (or warns of a wildcard address) and where the job's
    status is."""
    listening = addresses.listening
    if config.uses_agents:
        log.info("agents connect at http://%s:%d", ",".join(listening), port)
    elif (warning := wildcard_warning(listening, port)) is not None:
        log.warning("%s", warning)
    status_host = "127.0.0.1" if covered(listening, "127.0.0.1") else addresses.dialed[0]
    log.info("job %s: status at http://%s:%d/status (elasticrun status http://%s:%d)",
             job_id, status_host, port, status_host, port)
    log.debug("driver server on %s port %d", ", ".join(listening), port)
