"""The remote end of an SSH worker: a stdlib-only Python program, sent on the command line.

It reads the worker's command, directory and environment as one JSON line from stdin,
runs the command as the leader of a new session and watches stdin: a "stop" line, EOF
(the channel or connection closed) or SIGTERM/SIGHUP/SIGINT to itself ends the command's
whole process group (SIGTERM, then SIGKILL after the grace period).
"""

from __future__ import annotations

import base64
import functools
import shlex
import zlib

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
def remote_command(python: str) -> str:
    """`exec <python> -c '<loader>'`: one line, the same for every worker, no secrets."""
    packed = base64.b64encode(zlib.compress(BOOTSTRAP.encode(), 9)).decode("ascii")
    loader = f"import base64,zlib;exec(zlib.decompress(base64.b64decode('{packed}')))"
    return f"exec {shlex.quote(python)} -c {shlex.quote(loader)}"


