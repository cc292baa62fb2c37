"""Addresses and interfaces that reach a given host (stdlib only; driver and workers).

The driver advertises to each host the local address that routes to it; a worker gives
Gloo the interface that reaches the driver. Without this Gloo resolves the host name,
which on multi-homed hosts or in network namespaces often lands on an address the peers
cannot reach."""

from __future__ import annotations

import contextlib
import fcntl
import socket
import struct

_SIOCGIFADDR = 0x8915


def address_towards(host: str, port: int) -> str:
    """The local address the kernel would use to reach host:port (no packet is sent)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect((host, port))
        return str(sock.getsockname()[0])


def interface_with_address(address: str) -> str | None:
    """The name of the (IPv4) interface holding `address`, if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            with contextlib.suppress(OSError):
                request = struct.pack("256s", name.encode()[:15])
                reply = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
                if socket.inet_ntoa(reply[20:24]) == address:
                    return name
    return None


def interface_address(name: str) -> str | None:
    """The IPv4 address of interface `name`, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        with contextlib.suppress(OSError):
            request = struct.pack("256s", name.encode()[:15])
            return socket.inet_ntoa(fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)[20:24])
    return None


def interface_towards(host: str, port: int) -> str | None:
    try:
        return interface_with_address(address_towards(host, port))
    except OSError:
        return None
