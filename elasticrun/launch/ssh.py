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

A Python worker (`python SCRIPT` or `python -m MODULE`) is forked by its host's worker
template (worker/host_template.py), which imported torch once: started on a channel of its
own when the host's first such worker starts, it ends with that channel, when the launcher
closes or the connection dies. A template that cannot start, or
ELASTICRUN_WORKER_TEMPLATE=0, leaves the workers exec'd as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shlex
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import paramiko

from elasticrun import protocol
from elasticrun.errors import SpawnError
from elasticrun.launch.base import WorkerSpec
from elasticrun.launch.bootstrap import remote_command
from elasticrun.launch.forked import python_program, template_env
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
from elasticrun.worker.host_template import BOOT as TEMPLATE_BOOT

__all__ = ["SSHLauncher", "SSHProcess", "SSHSettings"]

log = logging.getLogger("elasticrun.launch.ssh")

MAX_CONNECT_THREADS = 32
TEMPLATE_READY_S = 60.0  # it imports torch: seconds, more on a loaded host
MAX_TEMPLATES = 4  # per host
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")  # in a file name


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
        self._template_lock = threading.Lock()  # one template starts at a time
        self._state_lock = threading.Lock()  # clients, closed and the templates below
        # (interpreter, common environment) -> (the template's channel, its socket's path)
        self._templates: dict[tuple[str, str], tuple[paramiko.Channel | None, str]] = {}
        self._starting: paramiko.Channel | None = None  # a template not ready yet

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

    def template(self, python: str, env: Mapping[str, str]) -> str:
        """The socket path of this host's worker template for `python` and `env` ("": none),
        started on first use. Blocking; raises SpawnError when the host cannot be reached.
        close() does not wait for a template that is starting: it closes its channel."""
        key = (python, json.dumps({"env": template_env(env)}, sort_keys=True))
        with self._template_lock:
            with self._state_lock:
                if key in self._templates:
                    return self._templates[key][1]
                if len(self._templates) >= MAX_TEMPLATES or self.closed:
                    return ""
            # A host that cannot be reached fails here as its worker would (SpawnError),
            # and nothing is noted: the next worker tries again.
            channel = self.start(f"exec {shlex.quote(python)} -c {shlex.quote(TEMPLATE_BOOT)}",
                                 (key[1] + "\n").encode("utf-8"))
            with self._state_lock:
                closed = self.closed
                self._starting = None if closed else channel
            path = "" if closed else _first_line(channel, TEMPLATE_READY_S)
            with self._state_lock:
                self._starting = None
                if self.closed or not path.startswith("/"):
                    # closed, failed, does not fork here, or too slow: workers are exec'd
                    channel.close()
                    self._templates[key] = (None, "")
                else:
                    self._templates[key] = (channel, path)
                return self._templates[key][1]

    def close(self) -> None:
        with self._state_lock:
            self.closed = True
            templates, self._templates = list(self._templates.values()), {}
            if self._starting is not None:
                templates.append((self._starting, ""))
            clients, self.clients = self.clients, []
        for channel, _ in templates:
            if channel is not None:
                channel.close()  # the template ends with its channel, its workers with it
        for client in clients:
            client.close()

    def _add(self, client: paramiko.SSHClient) -> None:
        with self._state_lock:
            if not self.closed:
                self.clients.append(client)
                return
        client.close()
        raise SpawnError("the SSH launcher was closed")

    def _drop(self, client: paramiko.SSHClient) -> None:
        with self._state_lock:
            if client in self.clients:
                self.clients.remove(client)
        client.close()

    def _open_channel(self) -> paramiko.Channel | None:
        """A session channel on an existing live connection; None if there is none."""
        with self._state_lock:
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
        forks = python_program(command) and env.get(protocol.ENV_WORKER_TEMPLATE) != "0"
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, self._start, connections, spec, forks)
        try:
            channel = await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(_close_channel)
            raise
        return SSHProcess(channel, host, env.get(protocol.ENV_WORKER_ID, ""), self._executor,
                          pid_file=str(spec.get("pid_file", "")))

    def _start(self, connections: _HostConnections, spec: dict[str, object],
               forks: bool) -> paramiko.Channel:
        """Blocking: the worker's channel, its host's template (if any) started first."""
        if forks:
            command = spec["command"]
            assert isinstance(command, list) and isinstance(spec["env"], dict)
            path = connections.template(command[0], spec["env"])
            if path:
                spec["template"] = path
                worker = str(spec["env"].get(protocol.ENV_WORKER_ID, ""))
                if worker:  # where its pid goes, for the host's probe
                    name = _UNSAFE.sub("_", worker)
                    spec["pid_file"] = f"{path.rsplit('/', 1)[0]}/{name}.pid"
        payload = (json.dumps(spec) + "\n").encode("utf-8")
        return connections.start(remote_command(self.settings.python), payload)

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


def _first_line(channel: paramiko.Channel, timeout: float) -> str:
    """The first line the channel's command prints, within `timeout` ("" if none)."""
    deadline = time.monotonic() + timeout
    data = b""
    try:
        while b"\n" not in data:
            channel.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = channel.recv(4096)
            if not chunk or time.monotonic() > deadline:
                return ""
            data += chunk
    except (TimeoutError, OSError, EOFError, paramiko.SSHException):
        return ""
    channel.settimeout(None)
    return data.split(b"\n", 1)[0].decode("utf-8", "replace").strip()


def _close_channel(future: asyncio.Future[paramiko.Channel]) -> None:
    """For a spawn cancelled while its channel was being opened."""
    if not future.cancelled() and future.exception() is None:
        future.result().close()


def plugin(options: LaunchOptions) -> SSHLauncher:
    no_arg(options, "ssh")
    return SSHLauncher(SSHSettings.from_config(options.config))
