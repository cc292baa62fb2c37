"""Severing a round's collective connections, so that nobody waits on a dead round.

Gloo offers no abort: a wait blocked on a peer that is alive but gone from the round
(or whose old group is kept alive by a lingering reference) lasts until the collective
timeout. So the runtime notes which TCP sockets the round's process group opened and,
when the round ends or breaks, shuts them down: blocked waits here and on every peer
fail at once with a connection error, which the elastic loop treats as a failure.
"""

from __future__ import annotations

import contextlib
import os
import socket


def open_socket_fds() -> dict[int, str]:
    """fd -> socket inode for every socket this process holds."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{name}")
            if target.startswith("socket:"):
                found[int(name)] = target
    return found


def new_tcp_sockets(before: dict[int, str], exclude_peer: tuple[str, int]) -> dict[int, str]:
    """Connected TCP sockets opened since `before`, except those to `exclude_peer`.
    Listening sockets are left alone: Gloo aborts the process if its listener fails."""
    result = {}
    for fd, inode in open_socket_fds().items():
        if before.get(fd) == inode:
            continue
        with contextlib.suppress(OSError):
            with socket.socket(fileno=os.dup(fd)) as sock:
                if sock.family not in (socket.AF_INET, socket.AF_INET6) \
                        or sock.type != socket.SOCK_STREAM:
                    continue
                try:
                    peer = sock.getpeername()[:2]
                except OSError:
                    continue  # not connected: a listener
                if peer != exclude_peer:
                    result[fd] = inode
    return result


def sever(sockets: dict[int, str]) -> int:
    """Shuts down the given sockets (if each fd still holds the same socket); the fds stay
    open for their owner to close. Returns how many were shut down."""
    current = open_socket_fds()
    count = 0
    for fd, inode in sockets.items():
        if current.get(fd) != inode:
            continue
        with contextlib.suppress(OSError):
            with socket.socket(fileno=os.dup(fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
                count += 1
    return count
