"""A worker template for an SSH host: the SSH launcher's workers there fork from it.

The SSH launcher starts one per host (and interpreter) on a session channel of its own:
`python -c "from elasticrun.worker.host_template import main; main()"`, the job's common
environment as one JSON line on stdin, with which it execs itself. It imports torch
(template.py's preload), listens on a Unix socket in a private directory and prints the
socket's path (or an empty line: no forking here, e.g. an import touched the GPU). Each
worker's bootstrap (launch/ssh/bootstrap.py) connects to it: the template forks a server for that
connection, which is template.py's `serve` for one worker: it forks the worker itself
with the bootstrap's stdout and stderr (the worker's channel), reports its pid and exit,
and kills it when the bootstrap goes.
The bootstrap writes the worker's pid into the directory, under its worker id, for the
host's probe (a forked worker's /proc/PID/environ is the template's).

The template ends with its channel (stdin's EOF: the launcher closed it, or the connection
died), at once even while it imports: it kills its servers, whose workers die with them
(their parent-death signal), and removes its directory. A template killed outright (its
host's processes SIGKILLed, the OOM killer) cannot: the next one on that host removes the
directories of this user's templates that are gone (their pid is in the name).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import threading

from elasticrun import protocol
from elasticrun.worker import template

_PR_SET_PDEATHSIG = 1
SOCKET_NAME = "template.sock"
PREFIX = "elasticrun-template-"  # then the template's pid, "-" and mkdtemp's suffix
BOOT = "from elasticrun.worker.host_template import main; main()"
SERVING = "serving"  # its argument once exec'd with the job's environment


def main() -> None:
    if sys.argv[1:] != [SERVING]:
        # The job's environment arrives on stdin (not on a command line, where `ps` shows
        # it). Exec'd with it, the template holds it in its /proc/PID/environ, as do the
        # workers it forks, and torch reads it at import.
        env = json.loads(sys.stdin.readline() or "{}").get("env") or dict(os.environ)
        os.execve(sys.executable, [sys.executable, "-c", BOOT, SERVING], env)
    _preload_unless_stdin_ends()
    with open("/proc/self/maps") as maps:
        if template.cuda_driver_loaded(maps.read()):
            print("", flush=True)  # workers are exec'd
            return
    sweep(tempfile.gettempdir())
    directory = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")  # 0700: this user only
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    path = os.path.join(directory, SOCKET_NAME)
    listener.bind(path)
    listener.listen(64)
    gc.freeze()
    servers: set[int] = set()
    print(path, flush=True)
    argv = None
    try:
        argv = _accept(listener, servers)  # returns only in a forked worker
    finally:
        if argv is None:
            for pid in servers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            shutil.rmtree(directory, ignore_errors=True)
            snapshots = os.environ.get(protocol.ENV_SNAPSHOT_DIR)
            if snapshots:  # the job's commits kept on this host (its end, or the link's)
                shutil.rmtree(snapshots, ignore_errors=True)
    if argv is not None:
        template.run_program(argv)


def sweep(root: str) -> list[str]:
    """Removes the directories under `root` of this user's templates that are no longer
    running; returns them."""
    removed = []
    for name in os.listdir(root):
        pid_text = name.removeprefix(PREFIX).split("-", 1)[0]
        if not name.startswith(PREFIX) or not pid_text.isdigit():
            continue
        path = os.path.join(root, name)
        try:
            if os.stat(path).st_uid != os.getuid():
                continue
            os.kill(int(pid_text), 0)
            continue  # running (or a pid reused since: left alone)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        except OSError:  # gone meanwhile, or another user's process
            continue
    return removed


def _preload_unless_stdin_ends() -> None:
    """template.py's preload (seconds, more on a loaded host), ending the process at once
    if the channel closes meanwhile (the job ended, the launcher died): not seconds later."""
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            readable, _, _ = select.select([0], [], [], 0.1)
            if readable and not os.read(0, 4096):
                os._exit(0)  # nothing to clean up yet

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    template.preload()
    done.set()
    watcher.join()  # forks follow: the process is single-threaded again


def _accept(listener: socket.socket, servers: set[int]) -> list[str] | None:
    """Serves connections until stdin ends (None); in a forked worker, its command."""
    while True:
        readable, _, _ = select.select([listener.fileno(), 0], [], [], 1.0)
        for _ in template.reaped(servers):  # a server ended with its worker
            pass
        if 0 in readable and not os.read(0, 4096):
            return None
        if listener.fileno() not in readable:
            continue
        connection, _ = listener.accept()
        pid = os.fork()
        if pid == 0:
            listener.close()
            devnull = os.open(os.devnull, os.O_RDWR)  # not the template's channel
            for descriptor in (0, 1, 2):
                os.dup2(devnull, descriptor)
            os.close(devnull)
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            return template.serve(connection.detach())  # in the worker: its command
        connection.close()
        servers.add(pid)
