"""Reaching remote hosts over SSH: settings, ~/.ssh/config, host-key policy, bounded connects."""

from __future__ import annotations

import contextlib
import errno
import getpass
import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko

from elasticrun.job.config import DriverConfig
from elasticrun.job.errors import SpawnError

log = logging.getLogger("elasticrun.launch.ssh.launcher")

RETRY_BACKOFF_S = (0.5, 1.0, 2.0)
MIN_ATTEMPT_S = 1.0  # an attempt gets at least this long, or is not made
DEAD_PEER_FACTOR = 3  # TCP_USER_TIMEOUT = keepalive interval x this

_KNOWN_HOSTS_LOCK = threading.Lock()


# --- settings and host resolution --------------------------------------------------------


@dataclass(frozen=True)
class SSHSettings:
    """How to reach remote hosts. None means: from the SSH config file, else the default."""

    port: int | None = None
    identity_file: Path | None = None
    user: str | None = None
    connect_timeout: float = 10.0  # one attempt
    connect_attempts: int = 3
    connect_total: float = 30.0  # every attempt together (--start-timeout): then it gives up
    accept_new_host_keys: bool = False
    known_hosts: Path | None = None  # default: UserKnownHostsFile, else ~/.ssh/known_hosts
    python: str = field(default_factory=lambda: sys.executable)
    config_file: Path | None = None  # default: ~/.ssh/config if it exists
    stop_grace_period: float = 5.0  # used remotely when the connection is lost
    keepalive_interval: float = 10.0  # 0: no keepalives, no dead-peer detection

    @classmethod
    def from_config(cls, config: DriverConfig) -> SSHSettings:
        return cls(port=config.ssh_port,
                   identity_file=config.ssh_identity_file,
                   accept_new_host_keys=config.ssh_accept_new_host_keys,
                   python=config.remote_python or sys.executable,
                   connect_timeout=min(10.0, config.start_timeout),
                   connect_total=config.start_timeout,
                   stop_grace_period=config.stop_grace_period)


@dataclass(frozen=True)
class _Target:
    """One host, resolved through the SSH config."""

    alias: str
    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...]
    known_hosts: Path
    proxy_command: str | None

    def describe(self) -> str:
        name = f"[{self.alias}]" if ":" in self.alias else self.alias
        if self.hostname != self.alias:
            name += f" ({self.hostname})"
        return f"{name}:{self.port}"


def _load_config(settings: SSHSettings) -> paramiko.SSHConfig:
    """The SSH config, with --ssh-port/user put first so that they win (and fill %p, %r)."""
    path = settings.config_file or Path("~/.ssh/config").expanduser()
    text = ""
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise SpawnError(f"cannot read SSH config file {path}: {exc.strerror}") from None
    elif settings.config_file is not None:
        raise SpawnError(f"SSH config file {path} does not exist")
    overrides = [f"  Port {settings.port}"] if settings.port is not None else []
    overrides += [f"  User {settings.user}"] if settings.user else []
    if overrides:
        text = "\n".join(["Host *", *overrides, text])
    try:
        return paramiko.SSHConfig.from_text(text)
    except paramiko.ConfigParseError as exc:
        raise SpawnError(f"cannot read SSH config file {path}: {exc}") from None


def _resolve(host: str, settings: SSHSettings, config: paramiko.SSHConfig) -> _Target:
    options = config.lookup(host)
    if options.get("proxyjump", "none").lower() != "none" and not options.get("proxycommand"):
        raise SpawnError("ProxyJump in the SSH config is not supported; use "
                         "'ProxyCommand ssh -W %h:%p <jump host>' instead")
    try:
        port = int(options.get("port", 22))
    except ValueError:
        raise SpawnError(f"bad Port {options.get('port')!r} in the SSH config") from None
    key_files: list[str] = []
    if settings.identity_file is not None:
        if not settings.identity_file.expanduser().is_file():
            raise SpawnError(f"SSH identity file {settings.identity_file} does not exist")
        key_files.append(str(settings.identity_file.expanduser()))
    for name in options.get("identityfile", []):
        path = os.path.expanduser(name)
        if os.path.isfile(path) and path not in key_files:
            key_files.append(path)
    known = settings.known_hosts
    if known is None:
        configured = options.get("userknownhostsfile", "").split()
        known = Path(configured[0] if configured else "~/.ssh/known_hosts")
    return _Target(
        alias=host,
        hostname=options.get("hostname", host),
        port=port,
        user=options.get("user") or getpass.getuser(),
        key_files=tuple(key_files),
        known_hosts=known.expanduser(),
        proxy_command=options.get("proxycommand"),
    )


# --- host keys ------------------------------------------------------------------------------


class _UnknownHostKey(paramiko.SSHException):
    pass


class _RejectPolicy(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        raise _UnknownHostKey(hostname)


class _AppendPolicy(paramiko.MissingHostKeyPolicy):
    """Accepts a new key and appends it to known_hosts (never rewrites the file)."""

    def __init__(self, known_hosts: Path) -> None:
        self._path = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with _KNOWN_HOSTS_LOCK:
            self._path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(self._path, "a", encoding="utf-8") as file:
                file.write(line)
        log.warning("added the %s host key of %s (%s) to %s", key.get_name(), hostname,
                    getattr(key, "fingerprint", "?"), self._path)


def _new_client(target: _Target, settings: SSHSettings) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    system = Path("/etc/ssh/ssh_known_hosts")
    if system.is_file():
        with contextlib.suppress(OSError):
            client.load_system_host_keys(str(system))
    if target.known_hosts.is_file():
        try:
            client.load_host_keys(str(target.known_hosts))
        except OSError as exc:
            raise SpawnError(f"cannot read {target.known_hosts}: {exc.strerror}") from None
    if settings.accept_new_host_keys:
        client.set_missing_host_key_policy(_AppendPolicy(target.known_hosts))
    else:
        client.set_missing_host_key_policy(_RejectPolicy())
    return client


# --- connecting -------------------------------------------------------------------------------


class _Retryable(Exception):
    """A connect failure worth another attempt; its message is the reason."""


def _open_socket(target: _Target, settings: SSHSettings, timeout: float) -> Any:
    if target.proxy_command:
        return paramiko.ProxyCommand(target.proxy_command)
    sock = socket.create_connection((target.hostname, target.port), timeout)
    interval = settings.keepalive_interval
    if interval > 0:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                            int(interval * DEAD_PEER_FACTOR * 1000))
    return sock


def _connect_once(target: _Target, settings: SSHSettings, timeout: float
                  ) -> paramiko.SSHClient:
    """One attempt, each of its waits bounded by `timeout`. Raises _Retryable or SpawnError
    (the reason only, without the host)."""
    client = _new_client(target, settings)
    try:
        sock = _open_socket(target, settings, timeout)
        client.connect(
            target.hostname, port=target.port, username=target.user,
            key_filename=list(target.key_files) or None, timeout=2 * timeout,
            banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout,
            sock=sock, allow_agent=True, look_for_keys=True,
        )
    except Exception as exc:
        client.close()
        _classify(exc, target)
        raise
    transport = client.get_transport()
    if transport is not None and settings.keepalive_interval > 0:
        transport.set_keepalive(max(1, int(settings.keepalive_interval)))
    return client


def _classify(exc: BaseException, target: _Target) -> None:
    """Turns a connect exception into _Retryable or SpawnError; returns for unknown ones."""
    if isinstance(exc, paramiko.BadHostKeyException):
        raise SpawnError(
            f"HOST KEY FOR {target.hostname} HAS CHANGED: the server offered a different "
            f"key than {target.known_hosts} holds (a reinstalled host or an attack; if "
            f"expected, run ssh-keygen -R '{_known_hosts_name(target)}')") from None
    if isinstance(exc, _UnknownHostKey):
        raise SpawnError(
            f"host key for {target.hostname} is not in known_hosts ({target.known_hosts}; "
            f"use --ssh-accept-new-host-keys or ssh to it once)") from None
    if isinstance(exc, paramiko.AuthenticationException) or (
            isinstance(exc, paramiko.SSHException) and "authentication" in str(exc).lower()):
        detail = _one_line(exc).rstrip(".")
        detail = "" if detail.lower() == "authentication failed" else f" ({detail})"
        raise SpawnError(f"authentication failed for {target.user}@{target.hostname}"
                         f"{detail}") from None
    if isinstance(exc, socket.gaierror):
        raise SpawnError(f"cannot resolve host name {target.hostname!r}") from None
    if isinstance(exc, ConnectionRefusedError) or (
            isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED):
        raise _Retryable("connection refused") from None
    if isinstance(exc, (TimeoutError, socket.timeout)):
        raise _Retryable("connection timed out") from None
    if isinstance(exc, paramiko.SSHException) and "banner" in str(exc):
        raise _Retryable("no SSH banner (timed out or the server dropped the connection)") \
            from None
    if isinstance(exc, paramiko.SSHException) and "No existing session" in str(exc):
        raise _Retryable("the SSH handshake timed out") from None
    if isinstance(exc, (paramiko.SSHException, EOFError, OSError)):
        raise _Retryable(_one_line(exc) or type(exc).__name__) from None


def _known_hosts_name(target: _Target) -> str:
    return target.hostname if target.port == 22 else f"[{target.hostname}]:{target.port}"


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return " ".join(str(exc).split())


def _connect(target: _Target, settings: SSHSettings) -> paramiko.SSHClient:
    """Connects with bounded retries, all of them within `connect_total` seconds (a host
    that cannot be reached within the start timeout is given up then, not attempts x the
    connect timeout later); raises SpawnError naming the host."""
    deadline = time.monotonic() + settings.connect_total
    reason = ""
    made = 0
    while made < max(1, settings.connect_attempts):
        left = deadline - time.monotonic()
        if made and left < MIN_ATTEMPT_S:
            break
        made += 1
        try:
            return _connect_once(target, settings,
                                 min(settings.connect_timeout, max(left, MIN_ATTEMPT_S)))
        except _Retryable as exc:
            reason = str(exc)
        except SpawnError as exc:
            raise SpawnError(f"cannot reach host {target.describe()} over SSH: {exc}") from None
        delay = min(RETRY_BACKOFF_S[min(made - 1, len(RETRY_BACKOFF_S) - 1)],
                    max(0.0, deadline - time.monotonic()))
        if made < settings.connect_attempts and delay > 0:
            log.debug("ssh to %s failed (%s); retrying in %gs", target.describe(), reason, delay)
            threading.Event().wait(delay)
    tries = f" (after {made} attempts)" if made > 1 else ""
    raise SpawnError(f"cannot reach host {target.describe()} over SSH: {reason}{tries}")


