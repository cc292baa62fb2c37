"""Where the driver listens and what each host dials (driver/listen.py)."""

from __future__ import annotations

from elasticrun.driver.server.listen import (
    covered,
    dial_address,
    listen_addresses,
    wildcard_warning,
)


def test_default_listens_on_loopback_and_the_dialed_addresses_only() -> None:
    assert listen_addresses((), all_local=True, dialed=["10.0.0.5"]) == ["127.0.0.1"]
    assert listen_addresses((), all_local=False, dialed=["10.0.0.5", "10.0.0.5",
                                                         "192.168.1.2"]) == [
        "127.0.0.1", "10.0.0.5", "192.168.1.2"]


def test_bind_overrides() -> None:
    assert listen_addresses(("10.0.0.5",), all_local=False, dialed=["192.168.1.2"]) == [
        "10.0.0.5"]
    assert listen_addresses(("0.0.0.0",), all_local=True, dialed=[]) == ["0.0.0.0"]


def test_hosts_dial_a_bound_address() -> None:
    assert dial_address((), "10.0.0.5") == "10.0.0.5"
    assert dial_address(("0.0.0.0",), "10.0.0.5") == "10.0.0.5"
    assert dial_address(("192.168.1.2", "10.0.0.5"), "10.0.0.5") == "10.0.0.5"
    assert dial_address(("192.168.1.2",), "10.0.0.5") == "192.168.1.2"


def test_covered_and_warning() -> None:
    assert covered(["127.0.0.1", "10.0.0.5"], "10.0.0.5")
    assert not covered(["127.0.0.1"], "10.0.0.5")
    assert covered(["::"], "10.0.0.5")
    assert wildcard_warning(["127.0.0.1", "10.0.0.5"], 80) is None
    warning = wildcard_warning(["0.0.0.0"], 29400)
    assert warning is not None and warning.startswith(
        "the driver listens on all interfaces (0.0.0.0:29400)")
