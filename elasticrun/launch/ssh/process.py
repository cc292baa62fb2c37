"""A remote worker seen through its SSH channel: its output, its exit status, stopping it,
and asking its host what its process is doing (a second channel runs a small probe).

Exit codes: the channel carries a plain exit status, so a remote command killed by signal
N is reported as 128+N (e.g. 143 for SIGTERM), the shell convention. A connection lost
before the remote exit status arrived is reported as 255, as OpenSSH's `ssh` does, and the
worker as lost with its host (`host_lost`): the way to the host went, not only the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import Executor
from typing import Any

import paramiko

from elasticrun.launch.ssh.inspection import inspect_over_ssh
from elasticrun.system.process_view import ProcessState, ProcessView
from elasticrun.system.timed import within

OUTPUT_LIMIT = 1024 * 1024  # bytes a reader buffers for one line (as in local.py)
READ_CHUNK = 32 * 1024
EXIT_CONNECTION_LOST = 255  # no exit status arrived: the connection or the bootstrap died
STOP_EXTRA_WAIT_S = 5.0  # after the grace period, before the channel is closed
OUTPUT_DRAIN_S = 2.0  # after the exit status, for output still in flight
# A probe of the worker's host decides within this (the pool's own bound, 2 s, is the
# backstop): a channel not opened by then, unreachable; a probe not finished, cannot tell.
INSPECT_WAIT_S = 1.5


class SSHProcess:
    """A remote worker: output and exit status come from its SSH channel."""

    def __init__(self, channel: paramiko.Channel, host: str, worker_id: str = "",
                 executor: Executor | None = None, pid_file: str = "") -> None:
        self.channel = channel
        self.host = host
        # how the host's probe finds the worker's process: its environment, or (forked by
        # the host's template) the file its bootstrap wrote its pid to
        self._worker_id = worker_id
        self._pid_file = pid_file
        self._executor = executor
        self.stdout = asyncio.StreamReader(limit=OUTPUT_LIMIT)
        self.stderr = asyncio.StreamReader(limit=OUTPUT_LIMIT)
        self._loop = asyncio.get_running_loop()
        self._exit: asyncio.Future[int] = self._loop.create_future()
        self.host_lost = False  # it ended with its connection, before any exit status
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

    async def inspect(self) -> ProcessView:
        transport = self.channel.get_transport()
        if self._exit.done():
            return ProcessView(ProcessState.GONE)
        if transport is None or not transport.is_active():
            return ProcessView(ProcessState.UNREACHABLE, "its SSH connection is closed")
        return await self._loop.run_in_executor(
            self._executor, inspect_over_ssh, transport, self._worker_id, INSPECT_WAIT_S,
            self._pid_file)

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
        self._call(self._set_exit, status if status >= 0 else EXIT_CONNECTION_LOST, status < 0)

    def _set_exit(self, code: int, connection_lost: bool = False) -> None:
        if not self._exit.done():
            self.host_lost = connection_lost
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


