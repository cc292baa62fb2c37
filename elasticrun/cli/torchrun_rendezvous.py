"""torchrun's rendezvous values, read as torch 2.13 reads them (torch/distributed/run.py:
_parse_rendezvous_config; rendezvous/utils.py: parse_rendezvous_endpoint): --rdzv-conf's
settings, an endpoint (--rdzv-endpoint, or --master-addr and --master-port), and the
defaults torchrun's rendezvous takes when they are not given. Pure: every value elasticrun
cannot honour is refused here, as one ConfigError line naming the flag and what it expects.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from elasticrun.job.errors import ConfigError

C10D_DEFAULT_PORT = 29400  # torchrun's c10d endpoint without a port
STATIC_DEFAULT_PORT = 29500  # torchrun's --master-port when not given
JOIN_TIMEOUT_S = 600.0  # torchrun's rendezvous join_timeout
LAST_CALL_TIMEOUT_S = 30.0  # torchrun's: after MIN nodes, how long more may join first
# --rdzv-conf keys torch's c10d backend reads (checked as it checks them, or elasticrun acts
# on them); `timeout` is read by the static backend only, and never checked here.
RDZV_BOOLS = ("is_host", "use_libuv")
RDZV_NUMBERS = ("join_timeout", "last_call_timeout", "close_timeout", "read_timeout",
                "keep_alive_interval", "keep_alive_max_attempt")
RDZV_KEYS = (*RDZV_NUMBERS, *RDZV_BOOLS, "timeout", "agent_token_file")


@dataclass(frozen=True)
class RdzvConf:
    """The --rdzv-conf keys elasticrun acts on (the others are accepted, and do nothing)."""

    join_timeout: float | None = None
    last_call_timeout: float | None = None
    is_host: bool | None = None
    agent_token_file: Path | None = None


def parse_rdzv_conf(value: str) -> tuple[RdzvConf, list[str]]:
    """`key=value,...` as torch reads it (a key and a value each), and the warnings: a key
    that neither torch's c10d backend nor elasticrun reads is ignored, as the backend
    ignores it, with a warning naming it (`'join_timeout`, its quote not stripped by a
    shell, is such a key). The keys the backend reads are checked as it checks them."""
    pairs: dict[str, str] = {}
    notes: list[str] = []
    for item in value.split(",") if value.strip() else []:
        key, _, setting = item.partition("=")
        key, setting = key.strip(), setting.strip()
        if not key or not setting:
            raise ConfigError(f"--rdzv-conf {value!r}: expected KEY=VALUE,... (e.g. "
                              f"join_timeout=900)")
        if key not in RDZV_KEYS:
            notes.append(f"--rdzv-conf {key}: not a rendezvous setting torchrun's c10d "
                         f"backend or elasticrun reads; ignored (known: "
                         f"{', '.join(RDZV_KEYS)})")
            continue
        if key in RDZV_NUMBERS:
            parse_seconds(f"--rdzv-conf {key}", setting, whole=True)
        if key in RDZV_BOOLS:
            _bool(f"--rdzv-conf {key}", setting)
        pairs[key] = setting
    join, last_call = pairs.get("join_timeout"), pairs.get("last_call_timeout")
    return RdzvConf(
        join_timeout=parse_seconds("--rdzv-conf join_timeout", join, whole=True)
        if join else None,
        last_call_timeout=parse_seconds("--rdzv-conf last_call_timeout", last_call,
                                        whole=True) if last_call else None,
        is_host=_bool("--rdzv-conf is_host", pairs["is_host"]) if "is_host" in pairs else None,
        agent_token_file=Path(pairs["agent_token_file"]) if "agent_token_file" in pairs
        else None), notes


def parse_seconds(name: str, value: str, whole: bool) -> float:
    """A positive number of seconds (whole: an integer, as torch reads its timeouts); `name`
    (the flag or variable) heads the error."""
    try:
        number = float(int(value)) if whole else float(value)
    except ValueError:
        raise ConfigError(f"{name} {value!r}: expected a whole number of seconds") from None
    if number <= 0:
        raise ConfigError(f"{name} {value!r}: must be positive")
    return number


def _bool(name: str, value: str) -> bool:
    """As torch's RendezvousParameters.get_as_bool reads it."""
    if value.lower() in ("1", "true", "t", "yes", "y"):
        return True
    if value.lower() in ("0", "false", "f", "no", "n"):
        return False
    raise ConfigError(f"{name} {value!r}: expected 1/0, true/false or yes/no")


def parse_endpoint(endpoint: str, default_port: int | None) -> tuple[str, int]:
    """HOST[:PORT] or [IPV6][:PORT] (torch's parse_rendezvous_endpoint); no port and no
    default: refused, as torchrun's static backend refuses it."""
    text = endpoint.strip()
    if text.startswith("[") and text.endswith("]"):
        host, port_text = text, None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            host, port_text = text, None
    host = host[1:-1] if len(host) > 1 and host[0] == "[" and host[-1] == "]" else host
    if port_text is None:
        if default_port is None:
            raise ConfigError(f"--rdzv-endpoint {endpoint!r}: expected HOST:PORT (the static "
                              f"backend needs a port)")
        port = default_port
    elif re.fullmatch(r"[0-9]{1,5}", port_text) and int(port_text) < 65536:
        port = int(port_text)
    else:
        raise ConfigError(f"--rdzv-endpoint {endpoint!r}: the port must be 0..65535")
    if not re.fullmatch(r"[\w.:-]+", host):
        raise ConfigError(f"--rdzv-endpoint {endpoint!r}: expected HOST:PORT, with HOST a "
                          f"host name or an IP address")
    return host, port
