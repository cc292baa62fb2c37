"""Remote workers over SSH (paramiko).

One SSH connection per host carries every worker on that host, one session channel each.
The remote command line is always the same, `exec <python> -c '<bootstrap>'`: the command,
working directory and environment (which holds the job secret) travel as one JSON line on
the channel's stdin, so nothing of them shows up in any process list.

The bootstrap runs the command as the leader of a new session and watches its stdin. A
"stop" line, EOF on stdin (the channel or the whole connection closed, e.g. because the
driver died) or a SIGTERM/SIGHUP/SIGINT to the bootstrap itself sends SIGTERM to the
command's process group and SIGKILL after the grace period, so no remote orphans remain.
A worker as seen through its channel (output, exit status, its host's probe) is an
SSHProcess (ssh_process.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import paramiko

from elasticrun import protocol
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
from elasticrun.launch.ssh_process import SSHProcess

__all__ = ["SSHLauncher", "SSHProcess", "SSHSettings"]

log = logging.getLogger("elasticrun.launch.ssh")

MAX_CONNECT_THREADS = 32


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
        return SSHProcess(channel, host, env.get(protocol.ENV_WORKER_ID, ""), self._executor)

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
