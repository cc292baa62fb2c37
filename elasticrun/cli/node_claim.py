"""A node of torchrun's multi-node form is a launcher process, not a host: several
`elasticrun --nnodes N --rdzv-endpoint H:P ...` on one machine are several nodes, as under
torchrun. What a launcher claims on this machine, each for its whole life:

- its place: the lowest index no other launcher of the same job (run id and endpoint) and
  the same name holds, by a lock on a file (released by the kernel when the process ends,
  however it ends); its name in the job is the name for index 0 (the host name, or
  --local-addr) and `NAME_K` beyond. A launcher started again takes the place it left.
- the endpoint: the launcher whose socket binds and listens on it hosts the job's driver,
  on that very socket; a launcher that finds it taken joins as an agent. Launchers started
  at the same moment agree without a race: only one bind succeeds.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

MAX_PLACES = 4096  # launchers of one job with one name on one machine


@dataclass
class Place:
    """A held place: `index` on this machine, `name` in the job; held until closed."""

    index: int
    name: str
    fd: int

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def node_name(base: str, index: int) -> str:
    """The job's name of place `index` of launchers named `base` (a host name or address;
    an IPv6 one is made a host-name-like label first)."""
    if index == 0:
        return base
    label = base.replace(":", "_").replace("%", "_") if ":" in base else base
    return f"{label}_{index}"


def places_directory(run_id: str, endpoint: str, base: str) -> Path:
    key = hashlib.sha256(f"{run_id}\0{endpoint}\0{base}".encode()).hexdigest()[:24]
    return Path(tempfile.gettempdir()) / f"elasticrun-{os.getuid()}" / "nodes" / key


def claim_place(directory: Path, base: str) -> Place:
    """The lowest free place in `directory` (OSError: the directory cannot be made)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for index in range(MAX_PLACES):
        fd = os.open(directory / f"{index}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        return Place(index, node_name(base, index), fd)
    raise OSError(errno.EMFILE, f"{MAX_PLACES} launchers of this job run here already")


def bind_endpoint(address: str, port: int) -> socket.socket | None:
    """A socket listening on address:port, or None when another process holds the port
    (OSError for any other reason it cannot be bound)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no owner
        sock.bind((address, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            return None
        raise
    sock.set_inheritable(False)
    return sock
