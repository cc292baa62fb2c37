"""Pure: which addresses the driver's server listens on, and which one each host dials.

By default it listens only where it must: loopback for an all-local job, otherwise loopback
plus the local address that routes to each host (more are added when new hosts need one).
`--bind` overrides this; binding to every interface works but is warned about.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

WILDCARDS = frozenset({"0.0.0.0", "::"})


def listen_addresses(bind: Sequence[str], all_local: bool, dialed: Iterable[str]) -> list[str]:
    if bind:
        return list(dict.fromkeys(bind))
    if all_local:
        return ["127.0.0.1"]
    return list(dict.fromkeys(["127.0.0.1", *dialed]))


def dial_address(bind: Sequence[str], routed: str) -> str:
    """What a host dials: the address that routes to it, unless --bind names specific
    addresses that do not include it (then the first of those)."""
    specific = [address for address in bind if address not in WILDCARDS]
    if not bind or any(address in WILDCARDS for address in bind) or routed in specific:
        return routed
    return specific[0]


def covered(listening: Iterable[str], address: str) -> bool:
    listening = set(listening)
    return address in listening or bool(listening & WILDCARDS)


def wildcard_warning(addresses: Iterable[str], port: int) -> str | None:
    wild = [a for a in addresses if a in WILDCARDS]
    if not wild:
        return None
    return (f"the driver listens on all interfaces ({wild[0]}:{port}): anyone who can reach "
            f"this port can try it. Requests without the job secret are refused and the "
            f"host-change webhook needs its token, but prefer --bind with the address your "
            f"hosts reach, or a firewall")
