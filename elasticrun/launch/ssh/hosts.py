"""The SSH connections to one host (paramiko, blocking: the SSH launcher's threads): session
channels on as few connections as sshd's MaxSessions allows, and the host's worker
templates (worker/host_template.py), started on first use, each on a channel of its own.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from collections.abc import Mapping

import paramiko

from elasticrun.job.errors import SpawnError
from elasticrun.launch.local.forked import template_env
from elasticrun.launch.ssh.connect import SSHSettings, _connect, _one_line, _Target
from elasticrun.worker.host_template import BOOT as TEMPLATE_BOOT

TEMPLATE_READY_S = 60.0  # it imports torch: seconds, more on a loaded host
MAX_TEMPLATES = 4  # per host


class HostConnections:
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
            path = "" if closed else first_line(channel, TEMPLATE_READY_S)
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


def first_line(channel: paramiko.Channel, timeout: float) -> str:
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
