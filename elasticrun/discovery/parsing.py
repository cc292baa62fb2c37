"""Pure parsing of host lists: discovery output, hostfiles and the -H flag.

Accepted forms, one host per line (or comma-separated for -H):
  host              default slots
  host:4            4 slots
  host slots=4      hostfile (MPI) style
  [fe80::1]:4       IPv6 with slots; [fe80::1] or a bare fe80::1 take default slots
Blank lines and `#` comments are ignored. A host listed twice keeps its first
position and takes the slots of its last line.

A host is an IP address or a name of RFC 1123 labels (letters, digits, hyphens; underscores
too, as container names have them), at most 253 characters; an IPv6 scope id is an
interface name (at most 15 characters of [A-Za-z0-9_.-], as Linux allows) or a number.
Nothing else passes: no shell or control characters reach a log line or a command.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from elasticrun.discovery.base import HostSlots
from elasticrun.job.errors import DiscoveryError
from elasticrun.system.printable import printable

_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_SCOPE = re.compile(r"[0-9]{1,10}|[A-Za-z0-9_.-]{1,15}")
_SLOTS_KEYWORD = re.compile(r"^(?:max_)?slots=(\S+)$")
MAX_SLOTS_PER_HOST = 4096


def format_host(host: str) -> str:
    """How a host is written next to a port or slot count, printably: IPv6 addresses get
    brackets."""
    host = printable(host)
    return f"[{host}]" if ":" in host else host


def format_hosts(hosts: HostSlots) -> str:
    """`host:slots,...`, as -H takes them."""
    return ",".join(f"{format_host(h)}:{n}" for h, n in hosts.items())


def parse_host_lines(text: str, default_slots: int, source: str) -> HostSlots:
    """Parses newline-separated host entries. Raises DiscoveryError naming source and line."""
    lines = ((f"line {n}: ", raw.split("#", 1)[0]) for n, raw in enumerate(text.splitlines(), 1))
    try:
        return _parse_entries(lines, default_slots)
    except ValueError as exc:
        raise DiscoveryError(f"{source}: {exc}") from None


def parse_hosts_flag(value: str, default_slots: int) -> HostSlots:
    """Parses -H/--hosts: comma-separated entries. Raises ValueError with the bad entry."""
    hosts = _parse_entries((("", entry) for entry in value.split(",")), default_slots)
    if not hosts:
        raise ValueError("no hosts given; expected host:slots[,host:slots...]")
    return hosts


def _parse_entries(entries: Iterable[tuple[str, str]], default_slots: int) -> HostSlots:
    """(where, text) pairs -> hosts; a bad entry raises ValueError starting with `where`."""
    hosts: HostSlots = {}
    for where, text in entries:
        entry = text.strip()
        if not entry:
            continue
        try:
            host, slots = parse_host_entry(entry, default_slots)
        except ValueError as exc:
            raise ValueError(f"{where}{_shorten(entry)!r}: {exc}") from None
        hosts[host] = slots
    return hosts


def parse_host_entry(entry: str, default_slots: int) -> tuple[str, int]:
    """One entry -> (host, slots). Raises ValueError saying what was expected."""
    words = entry.split()
    if len(words) == 2:
        match = _SLOTS_KEYWORD.match(words[1])
        if not match:
            raise ValueError("expected 'host slots=N' or 'host:N'")
        host = words[0]
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        return (_check_ip6(host) if ":" in host else _check_host(host)), \
            _parse_slots(match.group(1))
    if len(words) != 1:
        raise ValueError("expected one host per entry, like 'host:slots'")
    if entry.startswith("["):
        address, sep, rest = entry[1:].partition("]")
        if not sep:
            raise ValueError("missing ']' after IPv6 address")
        if rest and not rest.startswith(":"):
            raise ValueError("expected '[address]:slots'")
        slots = _parse_slots(rest[1:]) if rest else default_slots
        return _check_ip6(address), slots
    if entry.count(":") > 1:
        return _check_ip6(entry), default_slots
    host, sep, slots_text = entry.partition(":")
    slots = _parse_slots(slots_text) if sep else default_slots
    return _check_host(host), slots


def check_host(host: str) -> str:
    """A host name, IPv4 or IPv6 address (without brackets), normalized; else ValueError."""
    return _check_ip6(host) if ":" in host else _check_host(host)


def _parse_slots(text: str) -> int:
    if not re.fullmatch(r"[0-9]+", text):
        raise ValueError(f"slots must be a whole number >= 0, got {_shorten(text)!r}")
    if len(text.lstrip("0")) > len(str(MAX_SLOTS_PER_HOST)):
        raise ValueError(f"slots must be at most {MAX_SLOTS_PER_HOST}, got {_shorten(text)!r}")
    slots = int(text)
    if slots > MAX_SLOTS_PER_HOST:
        raise ValueError(f"slots must be at most {MAX_SLOTS_PER_HOST}, got {slots}")
    return slots


def _check_host(host: str) -> str:
    if not host:
        raise ValueError("empty host name")
    if len(host) <= 253 and all(_LABEL.fullmatch(label) for label in host.split(".")):
        return host
    raise ValueError("not a valid host name or address")


def _check_ip6(address: str) -> str:
    """A bare IPv6 address, normalized; a scope id (`fe80::1%eth0`) must be an interface
    name or number (ipaddress takes any text after the `%`)."""
    _, percent, scope = address.partition("%")
    try:
        if percent and not _SCOPE.fullmatch(scope):
            raise ValueError
        return str(ipaddress.IPv6Address(address))
    except ValueError:
        raise ValueError(f"not a valid IPv6 address: {_shorten(address)!r}") from None


def _shorten(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
