"""A worker template: a process that imported torch once, and forks local workers from it.

Each worker started as `python script.py` (or `python -m module`) would import torch and
its optimizers' dependencies again, seconds of CPU per worker; forked from here, it starts
at once (scale-up, replacement) and shares those pages. The driver (launch/local/forked.py) sends
one request per worker over a Unix socket: the command, the whole environment, the working
directory, the parent-death signal, and the worker's stdout and stderr. The child becomes
that program: its own session, those descriptors, that environment and directory, fresh
random seeds (torch's and numpy's, as a new process has; Python's random reseeds itself),
and then the script runs at the top level, so its exit, exit code, uncaught exception and
interpreter shutdown are those of `python script.py`. The template reports each child's
start and exit; it never runs anything else, and it exits with its socket (and the workers
it forked with it).

Besides torch, the template imports what the job's script imports of installed packages
(transformers, lightning: seconds each), so that workers started again after a restart
do not (worker/preload.py). Each child runs elasticrun's foothold beside its script
(worker/foothold.py).

Run as `python -c "from elasticrun.worker.template import main; main()" FD [command...]`
(the command names the job in `ps`, and says what the script imports).
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import traceback
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from elasticrun import protocol
from elasticrun.worker import foothold
from elasticrun.worker import preload as preloading

PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "torch.optim", "elasticrun.torch",
           "elasticrun.worker.foothold")
_PR_SET_PDEATHSIG = 1
MAX_REQUEST = 1 << 22


def main() -> None:
    preload_for(sys.argv[2:])
    program = serve(int(sys.argv[1]))  # returns only in a forked child
    run_program(program)


def preload() -> None:
    # The collector is off meanwhile: the imports allocate millions of objects, and the
    # collections those trigger find next to nothing (0.6 of 4.3 CPU-s on a 2-core machine).
    gc.disable()
    try:
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - not installed here: the workers import it
                continue
    finally:
        gc.enable()


def preload_for(command: list[str]) -> None:
    """preload(), then what the job's script imports (worker/preload.py), as long as the
    process can still fork safely after them; otherwise the template starts over without
    them (its workers import them themselves)."""
    preload()
    wanted = preloading.wanted(command, os.getcwd(), os.environ)
    if not wanted:
        return
    threads = preloading.thread_count()
    gc.disable()
    try:
        preloading.import_all(wanted)
    finally:
        gc.enable()
    with open("/proc/self/maps") as maps:
        cuda = cuda_driver_loaded(maps.read())
    if not preloading.fork_safe(threads, cuda):
        os.environ[protocol.ENV_PRELOAD] = "0"
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def cuda_driver_loaded(maps: str) -> bool:
    """Whether this process (its /proc/self/maps) loaded the CUDA driver: a child forked
    after that cannot use CUDA ("initialization error"), so the template must not fork."""
    return any(line.rstrip().endswith(("/libcuda.so", "/libcuda.so.1"))
               or "/libcuda.so." in line for line in maps.splitlines())


def serve(fd: int) -> list[str]:
    sock = socket.socket(fileno=fd)
    with open("/proc/self/maps") as maps:
        if cuda_driver_loaded(maps.read()):  # an import touched the GPU: exec every worker
            sock.sendall(b'{"ready": false}')
            os._exit(0)
    gc.freeze()  # the collector of a child would touch (and copy) every preloaded object
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wake-up fd is written
    signal.set_wakeup_fd(wake_w)
    children: set[int] = set()
    sock.sendall(b'{"ready": true}')
    while True:
        readable, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
        _reap(sock, children)
        if sock.fileno() not in readable:
            continue
        message, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST, 2)
        if not message:  # the driver closed the socket, or died: its workers go too
            for pid in children:
                _kill_session(pid)
            os._exit(0)
        request = json.loads(message)
        pid = os.fork()
        if pid == 0:
            return _become(request, fds, [sock.fileno(), wake_r, wake_w])
        for descriptor in fds:
            os.close(descriptor)
        children.add(pid)
        sock.sendall(json.dumps({"started": pid}).encode())


def reaped(children: set[int]) -> Iterator[tuple[int, int]]:
    """(pid, exit code) of each of `children` that has ended, reaped without waiting."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        yield pid, os.waitstatus_to_exitcode(status)


def _reap(sock: socket.socket, children: set[int]) -> None:
    for pid, code in reaped(children):
        sock.sendall(json.dumps({"exited": pid, "code": code}).encode())


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _become(request: dict[str, Any], fds: list[int], template_fds: list[int]) -> list[str]:
    """In the forked child: everything a fresh `exec` of the worker would have. Any failure
    ends the child (127) with one line on its stderr."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for descriptor in template_fds:
            os.close(descriptor)
        os.setsid()
        death_signal = int(request["death_signal"])
        parent = os.getppid()
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, death_signal)
        if os.getppid() != parent:  # the template died before the signal was set
            os._exit(128 + death_signal)
        stdin = os.open(os.devnull, os.O_RDONLY)
        for target, source in ((0, stdin), (1, fds[0]), (2, fds[1])):
            os.dup2(source, target)
        for descriptor in (stdin, *fds):
            os.close(descriptor)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _reseed()
        argv: list[str] = request["argv"]
        return argv
    except BaseException as exc:  # noqa: BLE001 - the child must never return to the loop
        try:
            os.write(2, f"elasticrun: cannot start the worker: {exc}\n".encode())
        finally:
            os._exit(127)


def _reseed() -> None:
    """A new process's generators start from fresh entropy; forked ones would all share
    the template's state."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def run_program(argv: list[str]) -> None:
    """`argv` (python script args..., or python -m module args...) at the top level, with
    elasticrun's foothold beside it (worker/foothold.py)."""
    foothold.start_from_env()
    if argv[1] == "-m":
        sys.argv = [argv[2], *argv[3:]]
        sys.path[0] = os.getcwd()
        sys.excepthook = _user_frames_only(None)
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    else:
        script = argv[1]
        sys.argv = [script, *argv[2:]]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        sys.excepthook = _user_frames_only(script)
        runpy.run_path(script, run_name="__main__")


def _user_frames_only(script: str | None) -> Any:
    """An uncaught exception's traceback without the frames of this module and runpy, as
    `python script.py` prints it."""
    own = {os.path.abspath(__file__)}

    def hook(kind: type[BaseException], value: BaseException,
             tb: TracebackType | None) -> None:
        while tb is not None and (tb.tb_frame.f_code.co_filename in own
                                  or "runpy" in tb.tb_frame.f_code.co_filename
                                  or tb.tb_frame.f_code.co_filename == "<string>"):
            tb = tb.tb_next
        traceback.print_exception(kind, value, tb)
        sys.stderr.flush()
        foothold.failed(value)

    return hook
