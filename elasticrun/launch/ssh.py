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
import contextlib
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import paramiko

from elasticrun.errors import SpawnError
from elasticrun.launch.base import WorkerSpec
from elasticrun.launch.bootstrap import remote_command
from elasticrun.launch.plugins import LaunchOptions, no_arg
from elasticrun.launch.ssh_connect import (
    SSHSettings,
    _connect,
    _load_config,
    _one_line,
    _resolve,
    _Target,
)
from elasticrun.timed import within

__all__ = ["SSHLauncher", "SSHProcess", "SSHSettings"]

log = logging.getLogger("elasticrun.launch.ssh")

OUTPUT_LIMIT = 1024 * 1024  # bytes a reader buffers for one line (as in local.py)
READ_CHUNK = 32 * 1024
EXIT_CONNECTION_LOST = 255  # no exit status arrived: the connection or the bootstrap died
STOP_EXTRA_WAIT_S = 5.0  # after the grace period, before the channel is closed
OUTPUT_DRAIN_S = 2.0  # after the exit status, for output still in flight
MAX_CONNECT_THREADS = 32


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
                await within(asyncio.shield(self._exit), grace + STOP_EXTRA_WAIT_S)
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

    Blocking: runs in the launcher's threads. Connects to one host happen one at a time.
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
        raise SpawnError("the SSH launcher was closed")

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


class SSHLauncher:
    """Starts workers on remote hosts over SSH. Call `await close()` when the job ends."""

    def __init__(self, settings: SSHSettings | None = None) -> None:
        self.settings = settings or SSHSettings()
        self._paramiko_quieted = _quiet_paramiko()  # until close(): the process may be the user's
        self._config: paramiko.SSHConfig | None = None
        self._hosts: dict[str, _HostConnections] = {}
        self._closed = False
        # Own threads for connects: slow hosts must not starve the loop's default executor.
        self._executor = ThreadPoolExecutor(max_workers=MAX_CONNECT_THREADS,
                                            thread_name_prefix="elasticrun-ssh")

    async def start(self, spec: WorkerSpec) -> SSHProcess:
        return await self.spawn(spec.host, spec.command, spec.env, spec.cwd)

    async def spawn(
        self, host: str, command: Sequence[str], env: Mapping[str, str], cwd: Path
    ) -> SSHProcess:
        if self._closed:
            raise SpawnError(f"cannot start a worker on host {host}: the SSH launcher is closed")
        if not command:
            raise SpawnError("no command to start")
        connections = self._connections(host)
        spec = {"command": list(command), "env": dict(env), "cwd": str(cwd),
                "grace": self.settings.stop_grace_period}
        payload = (json.dumps(spec) + "\n").encode("utf-8")
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, connections.start,
                                      remote_command(self.settings.python), payload)
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
        if self._paramiko_quieted:
            logging.getLogger("paramiko").setLevel(logging.NOTSET)
            self._paramiko_quieted = False

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


def _quiet_paramiko() -> bool:
    """paramiko logs tracebacks at ERROR for failures this module reports as one line.
    Whether its level was set here (from NOTSET)."""
    paramiko_log = logging.getLogger("paramiko")
    if paramiko_log.level == logging.NOTSET and not log.isEnabledFor(logging.DEBUG):
        paramiko_log.setLevel(logging.CRITICAL)
        return True
    return False


def _close_channel(future: asyncio.Future[paramiko.Channel]) -> None:
    """For a spawn cancelled while its channel was being opened."""
    if not future.cancelled() and future.exception() is None:
        future.result().close()


def plugin(options: LaunchOptions) -> SSHLauncher:
    no_arg(options, "ssh")
    return SSHLauncher(SSHSettings.from_config(options.config))
