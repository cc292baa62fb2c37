"""Remote workers over SSH (paramiko).

One SSH connection per host carries every worker on that host, one session channel each.
The remote command line is always the same, `exec <python> -c '<bootstrap>'`: the command,
working directory and environment (which holds the job secret) travel as one JSON line on
the channel's stdin, so nothing of them shows up in any process list.

The bootstrap runs the command as the leader of a new session and watches its stdin. A
"stop" line, EOF on stdin (the channel or the whole connection closed, e.g. because the
driver died) or a SIGTERM/SIGHUP/SIGINT to the bootstrap itself sends SIGTERM to the
command's process group and SIGKILL after the grace period, so no remote orphans remain.

Exit codes: the channel carries a plain exit status, so a remote command killed by signal
N is reported as 128+N (e.g. 143 for SIGTERM), the shell convention. A connection lost
before the remote exit status arrived is reported as 255, as OpenSSH's `ssh` does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import functools
import getpass
import json
import logging
import os
import shlex
import socket
import sys
import threading
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko

from elasticrun.errors import SpawnError

log = logging.getLogger("elasticrun.spawn.ssh")

OUTPUT_LIMIT = 1024 * 1024  # bytes a reader buffers for one line (as in local.py)
READ_CHUNK = 32 * 1024
EXIT_CONNECTION_LOST = 255  # no exit status arrived: the connection or the bootstrap died
STOP_EXTRA_WAIT_S = 5.0  # after the grace period, before the channel is closed
OUTPUT_DRAIN_S = 2.0  # after the exit status, for output still in flight
RETRY_BACKOFF_S = (0.5, 1.0, 2.0)
MAX_CONNECT_THREADS = 32
DEAD_PEER_FACTOR = 3  # TCP_USER_TIMEOUT = keepalive interval x this

_KNOWN_HOSTS_LOCK = threading.Lock()

# Runs on the remote host: stdlib only, Python >= 3.8, no output of its own except errors.
BOOTSTRAP = r'''
import json, os, signal, socket, subprocess, sys, threading


def fail(message, code):
    sys.stderr.write("elasticrun: %s on host %s\n" % (message, socket.gethostname()))
    sys.stderr.flush()
    os._exit(code)


class Stdin(object):
    def __init__(self):
        self.buf = b""

    def line(self):
        """The next line without its newline; None at EOF."""
        while b"\n" not in self.buf:
            try:
                data = os.read(0, 65536)
            except OSError:
                data = b""
            if not data:
                return None
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return line


class Group(object):
    """The command's process group: SIGTERM once, SIGKILL after the grace period."""

    def __init__(self, grace):
        self.grace = grace
        self.pid = None
        self.requested = None  # the grace period of the first stop request
        self.lock = threading.RLock()  # reentrant: signal handlers run in the main thread

    def attach(self, pid):
        with self.lock:
            self.pid = pid
            if self.requested is not None:
                self.terminate(self.requested)

    def stop(self, grace=None):
        with self.lock:
            if self.requested is not None:
                return
            self.requested = self.grace if grace is None else grace
            if self.pid is not None:
                self.terminate(self.requested)

    def terminate(self, grace):
        self.signal(signal.SIGTERM)
        timer = threading.Timer(grace, self.signal, (signal.SIGKILL,))
        timer.daemon = True
        timer.start()

    def signal(self, sig):
        try:
            os.killpg(self.pid, sig)
        except OSError:
            pass


def watch(stdin, group):
    while True:
        line = stdin.line()
        if line is None:
            group.stop()
            return
        words = line.split()
        if words and words[0] == b"stop":
            try:
                grace = float(words[1]) if len(words) > 1 else None
            except ValueError:
                grace = None
            group.stop(grace)


def start(spec):
    try:
        os.chdir(spec["cwd"])
    except OSError as exc:
        fail("cannot change to directory %r: %s" % (spec["cwd"], exc.strerror), 127)
    command = spec["command"]
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        return subprocess.Popen(command, env=spec["env"], stdin=devnull, close_fds=True,
                                start_new_session=True)
    except FileNotFoundError:
        fail("cannot start %r: command not found" % command[0], 127)
    except PermissionError:
        fail("cannot start %r: permission denied" % command[0], 126)
    except OSError as exc:
        fail("cannot start %r: %s" % (command[0], exc.strerror), 127)


def wait(child):
    """Waits for the command, then kills what it left in its group, then reaps it."""
    if hasattr(os, "waitid") and hasattr(os, "WNOWAIT"):
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            pass
        return child.wait()
    code = child.wait()
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except OSError:
        pass
    return code


def main():
    stdin = Stdin()
    first = stdin.line()
    if first is None:
        os._exit(EOF_CODE)
    spec = json.loads(first.decode("utf-8"))
    group = Group(float(spec.get("grace", 5.0)))
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: group.stop())
    child = start(spec)
    group.attach(child.pid)
    thread = threading.Thread(target=watch, args=(stdin, group))
    thread.daemon = True
    thread.start()
    code = wait(child)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 - code if code < 0 else code)


EOF_CODE = 1
main()
'''


@functools.lru_cache(maxsize=8)
def _remote_command(python: str) -> str:
    """`exec <python> -c '<loader>'`: one line, the same for every worker, no secrets."""
    packed = base64.b64encode(zlib.compress(BOOTSTRAP.encode(), 9)).decode("ascii")
    loader = f"import base64,zlib;exec(zlib.decompress(base64.b64decode('{packed}')))"
    return f"exec {shlex.quote(python)} -c {shlex.quote(loader)}"


# --- settings and host resolution --------------------------------------------------------


@dataclass(frozen=True)
class SSHSettings:
    """How to reach remote hosts. None means: from the SSH config file, else the default."""

    port: int | None = None
    identity_file: Path | None = None
    user: str | None = None
    connect_timeout: float = 10.0
    connect_attempts: int = 3
    accept_new_host_keys: bool = False
    known_hosts: Path | None = None  # default: UserKnownHostsFile, else ~/.ssh/known_hosts
    python: str = field(default_factory=lambda: sys.executable)
    config_file: Path | None = None  # default: ~/.ssh/config if it exists
    stop_grace_period: float = 5.0  # used remotely when the connection is lost
    keepalive_interval: float = 10.0  # 0: no keepalives, no dead-peer detection


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


def _open_socket(target: _Target, settings: SSHSettings) -> Any:
    if target.proxy_command:
        return paramiko.ProxyCommand(target.proxy_command)
    sock = socket.create_connection((target.hostname, target.port), settings.connect_timeout)
    interval = settings.keepalive_interval
    if interval > 0:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                            int(interval * DEAD_PEER_FACTOR * 1000))
    return sock


def _connect_once(target: _Target, settings: SSHSettings) -> paramiko.SSHClient:
    """One attempt. Raises _Retryable or SpawnError (the reason only, without the host)."""
    client = _new_client(target, settings)
    timeout = settings.connect_timeout
    try:
        sock = _open_socket(target, settings)
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
    """Connects with bounded retries; raises SpawnError naming the host."""
    attempts = max(1, settings.connect_attempts)
    reason = ""
    for attempt in range(attempts):
        try:
            return _connect_once(target, settings)
        except _Retryable as exc:
            reason = str(exc)
        except SpawnError as exc:
            raise SpawnError(f"cannot reach host {target.describe()} over SSH: {exc}") from None
        if attempt + 1 < attempts:
            delay = RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)]
            log.debug("ssh to %s failed (%s); retrying in %gs", target.describe(), reason, delay)
            threading.Event().wait(delay)
    tries = f" (after {attempts} attempts)" if attempts > 1 else ""
    raise SpawnError(f"cannot reach host {target.describe()} over SSH: {reason}{tries}")


# --- workers --------------------------------------------------------------------------------


class SSHProcess:
    """A remote worker: output and exit status come from its SSH channel."""

    def __init__(self, channel: paramiko.Channel, host: str) -> None:
        self.channel = channel
        self.host = host
        self.stdout = asyncio.StreamReader(limit=OUTPUT_LIMIT)
        self.stderr = asyncio.StreamReader(limit=OUTPUT_LIMIT)
        self._loop = asyncio.get_running_loop()
        self._exit: asyncio.Future[int] = self._loop.create_future()
        self._pumps = [
            _thread(f"ssh-stdout-{host}", self._pump, channel.recv, self.stdout),
            _thread(f"ssh-stderr-{host}", self._pump, channel.recv_stderr, self.stderr),
        ]
        _thread(f"ssh-wait-{host}", self._wait_for_exit)

    @property
    def returncode(self) -> int | None:
        return self._exit.result() if self._exit.done() else None

    async def wait(self) -> int:
        """The remote exit code: 128+N for a remote death by signal N, 255 if the
        connection was lost first."""
        return await asyncio.shield(self._exit)

    async def stop(self, grace_period: float) -> None:
        if not self._exit.done():
            grace = max(0.0, grace_period)
            await asyncio.to_thread(self._send, f"stop {grace:g}\n".encode())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._exit), grace + STOP_EXTRA_WAIT_S)
        # A closed channel ends the bootstrap's stdin: it kills whatever is left, at once.
        await asyncio.to_thread(self.channel.close)

    def _send(self, data: bytes) -> None:
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self.channel.sendall(data)

    def _pump(self, recv: Any, reader: asyncio.StreamReader) -> None:
        """Thread: one channel stream into one reader, until EOF."""
        while True:
            try:
                data = recv(READ_CHUNK)
            except (OSError, EOFError, paramiko.SSHException):
                data = b""
            if not data:
                break
            if not self._call(reader.feed_data, data):
                return
        self._call(reader.feed_eof)

    def _wait_for_exit(self) -> None:
        """Thread: the exit status (or the channel's end), then the channel is closed."""
        self.channel.recv_exit_status()
        status = self.channel.exit_status
        # Output still in flight arrives before the channel closes; a process that escaped
        # the bootstrap's process group must not hold the readers open forever.
        for pump in self._pumps:
            pump.join(OUTPUT_DRAIN_S)
        self.channel.close()
        self._call(self._set_exit, status if status >= 0 else EXIT_CONNECTION_LOST)

    def _set_exit(self, code: int) -> None:
        if not self._exit.done():
            self._exit.set_result(code)

    def _call(self, fn: Any, *args: Any) -> bool:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
            return True
        except RuntimeError:  # the event loop is closed: nobody listens any more
            return False


def _thread(name: str, target: Any, *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread


class _HostConnections:
    """The SSH connections to one host: normally one; more if sshd's MaxSessions is reached.

    Blocking: runs in the spawner's threads. Connects to one host happen one at a time.
    """

    def __init__(self, target: _Target, settings: SSHSettings) -> None:
        self.target = target
        self.settings = settings
        self.clients: list[paramiko.SSHClient] = []
        self.closed = False
        self._connect_lock = threading.Lock()
        self._clients_lock = threading.Lock()

    def start(self, remote: str, payload: bytes) -> paramiko.Channel:
        """A session channel running `remote`, with `payload` written to its stdin."""
        with self._connect_lock:
            channel = self._open_channel()
            if channel is None:
                self._add(_connect(self.target, self.settings))
                channel = self._open_channel()
        if channel is None:
            raise SpawnError(f"cannot open an SSH session on host {self.target.describe()}")
        try:
            channel.exec_command(remote)
            channel.sendall(payload)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            channel.close()
            raise SpawnError(f"cannot start a command on host {self.target.describe()} over "
                             f"SSH: {_one_line(exc)}") from None
        return channel

    def close(self) -> None:
        with self._clients_lock:
            self.closed = True
            clients, self.clients = self.clients, []
        for client in clients:
            client.close()

    def _add(self, client: paramiko.SSHClient) -> None:
        with self._clients_lock:
            if not self.closed:
                self.clients.append(client)
                return
        client.close()
        raise SpawnError("the SSH spawner was closed")

    def _drop(self, client: paramiko.SSHClient) -> None:
        with self._clients_lock:
            if client in self.clients:
                self.clients.remove(client)
        client.close()

    def _open_channel(self) -> paramiko.Channel | None:
        """A session channel on an existing live connection; None if there is none."""
        with self._clients_lock:
            clients = list(self.clients)
        for client in clients:
            transport = client.get_transport()
            if transport is None or not transport.is_active():
                self._drop(client)
                continue
            try:
                return transport.open_session(timeout=self.settings.connect_timeout)
            except paramiko.ChannelException:
                continue  # MaxSessions reached on this connection
            except (paramiko.SSHException, OSError, EOFError):
                self._drop(client)
        return None


class SSHSpawner:
    """Starts workers on remote hosts over SSH. Call `await close()` when the job ends."""

    def __init__(self, settings: SSHSettings | None = None) -> None:
        self.settings = settings or SSHSettings()
        _quiet_paramiko()
        self._config: paramiko.SSHConfig | None = None
        self._hosts: dict[str, _HostConnections] = {}
        self._closed = False
        # Own threads for connects: slow hosts must not starve the loop's default executor.
        self._executor = ThreadPoolExecutor(max_workers=MAX_CONNECT_THREADS,
                                            thread_name_prefix="elasticrun-ssh")

    async def spawn(
        self, host: str, command: Sequence[str], env: Mapping[str, str], cwd: Path
    ) -> SSHProcess:
        if self._closed:
            raise SpawnError(f"cannot start a worker on host {host}: the SSH spawner is closed")
        if not command:
            raise SpawnError("no command to start")
        connections = self._connections(host)
        spec = {"command": list(command), "env": dict(env), "cwd": str(cwd),
                "grace": self.settings.stop_grace_period}
        payload = (json.dumps(spec) + "\n").encode("utf-8")
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, connections.start,
                                      _remote_command(self.settings.python), payload)
        try:
            channel = await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(_close_channel)
            raise
        return SSHProcess(channel, host)

    async def close(self) -> None:
        """Closes every connection; remote workers still running are killed by their bootstrap."""
        self._closed = True
        hosts, self._hosts = list(self._hosts.values()), {}
        await asyncio.gather(*(asyncio.to_thread(h.close) for h in hosts),
                             return_exceptions=True)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _connections(self, host: str) -> _HostConnections:
        connections = self._hosts.get(host)
        if connections is None:
            try:
                target = _resolve(host, self.settings, self._ssh_config())
            except SpawnError as exc:
                raise SpawnError(f"cannot reach host {host} over SSH: {exc}") from None
            connections = self._hosts[host] = _HostConnections(target, self.settings)
        return connections

    def _ssh_config(self) -> paramiko.SSHConfig:
        if self._config is None:
            self._config = _load_config(self.settings)
        return self._config


def _quiet_paramiko() -> None:
    """paramiko logs tracebacks at ERROR for failures this module reports as one line."""
    paramiko_log = logging.getLogger("paramiko")
    if paramiko_log.level == logging.NOTSET and not log.isEnabledFor(logging.DEBUG):
        paramiko_log.setLevel(logging.CRITICAL)


def _close_channel(future: asyncio.Future[paramiko.Channel]) -> None:
    """For a spawn cancelled while its channel was being opened."""
    if not future.cancelled() and future.exception() is None:
        future.result().close()
