"""Local workers forked from a worker template (worker/template.py) instead of exec'd.

A worker command `python script.py ...` or `python -m module ...` is sent to a template
process started once per launcher with that same interpreter and the job's common
environment; the template has imported torch already, so the worker starts in milliseconds
instead of seconds of imports. Anything else (another program, interpreter options, a
script that is not there, a template that cannot start, ELASTICRUN_WORKER_TEMPLATE=0) is
exec'd as before: forking is an optimisation that never changes whether or how a worker
runs. What differs, and README says: /proc/PID/environ (the template's, without the
per-worker variables, which the worker's own environment has), and a template that dies
takes its workers along, as the driver's death does.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import re
import signal
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

from elasticrun import protocol
from elasticrun.job.errors import SpawnError
from elasticrun.system.process_view import ProcessState, ProcessView, read_process_view
from elasticrun.system.spawning import kill_session, signal_session, spawn_session, stop_session
from elasticrun.system.timed import within

log = logging.getLogger("elasticrun.launch")

BOOT = "from elasticrun.worker.template import main; main()"
READY_TIMEOUT_S = 120.0  # the template imports torch (tens of seconds on a loaded host)
ANSWER_TIMEOUT_S = 10.0  # a started template forks at once
MAX_TEMPLATES = 4
OUTPUT_LIMIT = 1024 * 1024
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?")
_MODULE = re.compile(r"[A-Za-z_][\w.]*")
# What elasticrun sets for each worker (its place, how to reach the driver, the job's
# secret): the template does not carry them; each child gets them in its environment.
PER_WORKER = frozenset({
    protocol.ENV_HOSTNAME, protocol.ENV_RANK, protocol.ENV_SIZE, protocol.ENV_LOCAL_RANK,
    protocol.ENV_LOCAL_SIZE, protocol.ENV_CROSS_RANK, protocol.ENV_CROSS_SIZE,
    protocol.ENV_RENDEZVOUS_ADDR, protocol.ENV_RENDEZVOUS_PORT, protocol.ENV_WORKER_ID,
    protocol.ENV_SECRET, protocol.ENV_CUDA_DEVICE, protocol.ENV_ROUND, "RANK", "WORLD_SIZE",
    "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
    "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_ERROR_FILE", protocol.ENV_RESTORE})


def python_program(command: Sequence[str]) -> bool:
    """`python SCRIPT ...` or `python -m MODULE ...`, with no interpreter options."""
    if len(command) < 2 or not _PYTHON.fullmatch(Path(command[0]).name):
        return False
    if command[1] == "-m":
        return len(command) >= 3 and bool(_MODULE.fullmatch(command[2]))
    return not command[1].startswith("-")


def forkable(command: Sequence[str], cwd: Path) -> bool:
    """Pure but for one stat: a python program whose SCRIPT (if not -m) is a file."""
    return python_program(command) and (command[1] == "-m" or (cwd / command[1]).is_file())


def template_env(env: Mapping[str, str]) -> dict[str, str]:
    """What the template is started with: the workers' environment but for what elasticrun
    sets per worker (each child gets its whole environment anyway)."""
    return {k: v for k, v in env.items()
            if k not in PER_WORKER and not k.startswith(protocol.HOROVOD_ENV_PREFIX)}


class ForkedProcess:
    """A worker forked by a template: the template is its parent and reports its exit."""

    def __init__(self, pid: int, stdout: asyncio.StreamReader, stderr: asyncio.StreamReader,
                 exited: asyncio.Future[int]) -> None:
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self._exited = exited

    @property
    def returncode(self) -> int | None:
        return self._exited.result() if self._exited.done() else None

    async def inspect(self) -> ProcessView:
        if self._exited.done():
            return ProcessView(ProcessState.GONE)
        return read_process_view(self.pid)

    async def wait(self) -> int:
        code = await asyncio.shield(self._exited)
        signal_session(self.pid, signal.SIGKILL)  # what it left in its group
        return code

    async def stop(self, grace_period: float) -> None:
        await stop_session(self.pid, self._exited, grace_period)


class _Template:
    """One template process and its socket; answers come in the order of the requests."""

    def __init__(self, process: asyncio.subprocess.Process, sock: socket.socket) -> None:
        self.process = process
        self._sock = sock
        loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[None] = loop.create_future()
        # retrieved here too: a start that stopped waiting (cancelled) leaves none to see it
        self.ready.add_done_callback(lambda done: done.cancelled() or done.exception())
        self._answers: collections.deque[asyncio.Future[dict[str, int]]] = collections.deque()
        self._exits: dict[int, asyncio.Future[int]] = {}
        self.closed = False
        loop.add_reader(sock.fileno(), self._read)

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._lost()
                return
            message = json.loads(data)
            if "ready" in message and not self.ready.done():
                if message["ready"]:
                    self.ready.set_result(None)
                else:  # it cannot fork safely (the CUDA driver is loaded)
                    self.ready.set_exception(SpawnError("the worker template cannot fork"))
            elif "started" in message:
                pid = message["started"]
                self._exits[pid] = asyncio.get_running_loop().create_future()
                answer = self._answers.popleft() if self._answers else None
                if answer is None or answer.done():  # its start was given up: not a worker
                    signal_session(pid, signal.SIGKILL)
                else:
                    answer.set_result(message)
            elif "exited" in message:
                exited = self._exits.pop(message["exited"], None)
                if exited is not None and not exited.done():
                    exited.set_result(message["code"])

    def _lost(self) -> None:
        """The template is gone: its workers die with it (parent-death signal); their exit
        codes are unknown (255, as for any worker whose way back was lost)."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
        self._sock.close()
        gone = SpawnError("the worker template exited")
        if not self.ready.done():
            self.ready.set_exception(gone)
        for answer in self._answers:
            if not answer.done():
                answer.set_exception(gone)
        for exited in self._exits.values():
            if not exited.done():
                exited.set_result(255)

    async def fork(self, command: Sequence[str], env: Mapping[str, str], cwd: Path,
                   death_signal: int) -> ForkedProcess:
        loop = asyncio.get_running_loop()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        answer: asyncio.Future[dict[str, int]] = loop.create_future()
        try:
            request = json.dumps({"argv": list(command), "env": dict(env), "cwd": str(cwd),
                                  "death_signal": death_signal}).encode()
            socket.send_fds(self._sock, [request], [out_w, err_w])
            self._answers.append(answer)
        except OSError as exc:
            for fd in (out_r, err_r):
                os.close(fd)
            self._lost()
            raise SpawnError(f"cannot start {command[0]!r}: the worker template is gone "
                             f"({exc.strerror})") from None
        finally:
            os.close(out_w)
            os.close(err_w)
        try:
            message = await within(answer, ANSWER_TIMEOUT_S)
        except (TimeoutError, SpawnError):
            for fd in (out_r, err_r):
                os.close(fd)
            raise SpawnError(f"cannot start {command[0]!r}: the worker template did not "
                             "answer") from None
        pid = message["started"]
        stdout = await _reader(out_r)
        stderr = await _reader(err_r)
        return ForkedProcess(pid, stdout, stderr, self._exits.get(pid) or _done(loop, 255))

    async def close(self) -> None:
        self._lost()
        await kill_session(self.process)


def _done(loop: asyncio.AbstractEventLoop, code: int) -> asyncio.Future[int]:
    future: asyncio.Future[int] = loop.create_future()
    future.set_result(code)
    return future


async def _reader(fd: int) -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=OUTPUT_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                 os.fdopen(fd, "rb", 0))
    return reader


class Forker:
    """The templates of one launcher, one per interpreter and common environment, started
    when first needed."""

    def __init__(self, death_signal: int, preexec: object) -> None:
        self._death_signal = death_signal
        self._preexec = preexec  # the template's own parent-death signal (local.py)
        self._templates: dict[tuple[str, frozenset[tuple[str, str]]], _Template | None] = {}
        self._lock = asyncio.Lock()

    async def start(self, command: Sequence[str], env: Mapping[str, str],
                    cwd: Path) -> ForkedProcess | None:
        """The worker, forked; None when it cannot be (then exec it)."""
        if env.get(protocol.ENV_WORKER_TEMPLATE) == "0" or not forkable(command, cwd):
            return None
        common = template_env(env)
        key = (command[0], frozenset(common.items()))
        async with self._lock:
            if key not in self._templates:
                if len(self._templates) >= MAX_TEMPLATES:
                    return None
                self._templates[key] = await self._start_template(command, common, cwd)
        template = self._templates[key]
        if template is None or template.closed:
            return None
        return await template.fork(command, env, cwd, self._death_signal)

    async def _start_template(self, command: Sequence[str], env: dict[str, str],
                              cwd: Path) -> _Template | None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = await spawn_session(
                [command[0], "-c", BOOT, str(theirs.fileno()), *command], env=env,
                cwd=str(cwd), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                pass_fds=[theirs.fileno()], preexec_fn=self._preexec)
        except OSError as exc:
            log.debug("no worker template (%s): workers are exec'd", exc)
            ours.close()
            return None
        finally:
            theirs.close()
        ours.setblocking(False)
        template = _Template(process, ours)
        try:
            await within(asyncio.shield(template.ready), READY_TIMEOUT_S)
        except (TimeoutError, SpawnError):
            log.debug("the worker template did not start: workers are exec'd")
            await template.close()
            return None
        except asyncio.CancelledError:  # (the start it was for was cancelled)
            await template.close()
            raise
        return template

    async def close(self) -> None:
        for template in self._templates.values():
            if template is not None:
                await template.close()
        self._templates.clear()
