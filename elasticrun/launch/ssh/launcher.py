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
SSHProcess (process.py).

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
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import paramiko

from elasticrun import protocol
from elasticrun.job.errors import SpawnError
from elasticrun.launch.base import WorkerSpec
from elasticrun.launch.local.forked import python_program
from elasticrun.launch.ssh.bootstrap import remote_command
from elasticrun.launch.ssh.connect import SSHSettings, _load_config, _resolve
from elasticrun.launch.ssh.hosts import HostConnections, first_line
from elasticrun.launch.ssh.process import SSHProcess

__all__ = ["SSHLauncher", "SSHProcess", "SSHSettings"]

log = logging.getLogger("elasticrun.launch.ssh.launcher")

MAX_CONNECT_THREADS = 32
ANSWER_S = 30.0  # a detached command's bootstrap says "started PID" within this
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")  # in a file name


class SSHLauncher:
    """Starts workers on remote hosts over SSH. Call `await close()` when the job ends."""

    def __init__(self, settings: SSHSettings | None = None) -> None:
        self.settings = settings or SSHSettings()
        self._paramiko_quieted = False  # from the first host until close(): the process
        # may be the user's
        self._config: paramiko.SSHConfig | None = None
        self._hosts: dict[str, HostConnections] = {}
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

    def _start(self, connections: HostConnections, spec: dict[str, object],
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

    async def detach(self, host: str, command: Sequence[str], env: Mapping[str, str],
                     cwd: Path, log_name: str) -> int:
        """Starts `command` on `host` in a session of its own that outlives this launcher
        (bootstrap.py's detach), its output appended to `log_name` in its $TMPDIR.
        Its pid; SpawnError (one line) when it cannot be started."""
        spec = {"command": list(command), "env": dict(env), "cwd": str(cwd),
                "detach": log_name}
        line, error, _ = await self._answer(
            host, remote_command(self.settings.python), (json.dumps(spec) + "\n").encode(),
            ANSWER_S)
        words = line.split()
        if len(words) != 2 or words[0] != "started" or not words[1].isdigit():
            raise SpawnError(f"cannot start {command[0]} on host {host} over SSH: "
                             f"{error or line or 'no answer'}")
        return int(words[1])

    async def kill_session(self, host: str, pid: int, after: float) -> None:
        """SIGKILLs the session `pid` leads on `host` once `pid` has exited or `after`
        seconds have passed (a detached command that did not end by itself). Bounded;
        a host that cannot be reached is left as it is."""
        ticks = max(0, int(after * 10))
        script = (f"i=0; while kill -0 {pid} 2>/dev/null && [ $i -lt {ticks} ]; do "
                  f"sleep 0.1; i=$((i+1)); done; kill -KILL -- -{pid} 2>/dev/null; echo done")
        try:
            await self._answer(host, script, b"", after + self.settings.connect_timeout)
        except SpawnError as exc:
            log.warning("cannot stop process %d on host %s: %s", pid, host, exc)

    async def local_address(self, host: str) -> str | None:
        """This machine's address on its SSH connection to `host` (connecting if needed)."""
        return (await self._answer(host, "true", b"", self.settings.connect_total))[2]

    async def _answer(self, host: str, remote: str, payload: bytes,
                      timeout: float) -> tuple[str, str, str | None]:
        """Runs `remote` with `payload` on its stdin: its first line of output, its error
        output's first line, and this machine's address on the connection."""
        if self._closed:
            raise SpawnError(f"cannot reach host {host}: the SSH launcher is closed")
        connections = self._connections(host)

        def run() -> tuple[str, str, str | None]:
            channel = connections.start(remote, payload)
            try:
                line = first_line(channel, timeout)
                error = channel.recv_stderr(4096).decode("utf-8", "replace") \
                    if not line and channel.recv_stderr_ready() else ""
                return line, " ".join(error.split()), _local_address(channel)
            finally:
                channel.close()

        return await asyncio.get_running_loop().run_in_executor(self._executor, run)

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

    def _connections(self, host: str) -> HostConnections:
        connections = self._hosts.get(host)
        if connections is None:
            if not self._paramiko_quieted:
                self._paramiko_quieted = _quiet_paramiko()
            try:
                target = _resolve(host, self.settings, self._ssh_config())
            except SpawnError as exc:
                raise SpawnError(f"cannot reach host {host} over SSH: {exc}") from None
            connections = self._hosts[host] = HostConnections(target, self.settings)
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


def _local_address(channel: paramiko.Channel) -> str | None:
    """This machine's address on the channel's connection (None: not a plain socket)."""
    getsockname = getattr(getattr(channel.get_transport(), "sock", None), "getsockname", None)
    try:
        return str(getsockname()[0]) if getsockname is not None else None
    except OSError:
        return None


def _close_channel(future: asyncio.Future[paramiko.Channel]) -> None:
    """For a spawn cancelled while its channel was being opened."""
    if not future.cancelled() and future.exception() is None:
        future.result().close()
