"""The remote end of an SSH worker: a stdlib-only Python program, sent on the command line.

It reads the worker's command, directory and environment as one JSON line from stdin,
runs the command as the leader of a new session (forked by the host's worker template,
host_template.py, when the line names one and the command is a Python script or module;
else started as usual) and watches stdin: a "stop" line, EOF
(the channel or connection closed) or SIGTERM/SIGHUP/SIGINT to itself ends the command's
whole process group (SIGTERM, then SIGKILL after the grace period).

A line with "detach": LOG starts the command in a session of its own that outlives the
channel (a job's agent, launch/ssh/agents.py), its output appended to LOG (a relative
path: in the command's $TMPDIR, else the host's, else /tmp), prints
"started PID" and exits 0.
"""

from __future__ import annotations

import base64
import functools
import shlex
import zlib

# Runs on the remote host: stdlib only, Python >= 3.8, no output of its own except errors.
BOOTSTRAP = r'''
import array, json, os, signal, socket, subprocess, sys, threading


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
    forked = fork(spec)
    if forked is not None:
        return forked
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


class Forked(object):
    """A worker forked by the host's template, which reports its exit."""

    def __init__(self, sock, pid, pid_file):
        self.sock = sock
        self.pid = pid
        self.pid_file = pid_file

    def wait(self):
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                data = b""
            if not data:  # the template is gone, and its workers with it
                return -signal.SIGKILL
            message = json.loads(data.decode("utf-8"))
            if message.get("exited") == self.pid:
                return message["code"]


def fork(spec):
    """The command forked by the host's template; None: start it as usual."""
    path, command = spec.get("template"), spec["command"]
    if not path or len(command) < 2 or (command[1] != "-m" and not os.path.isfile(command[1])):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.settimeout(TEMPLATE_WAIT_S)
        sock.connect(path)
        if not json.loads(sock.recv(4096).decode("utf-8")).get("ready"):
            raise ValueError("the template does not fork")
        request = json.dumps({"argv": command, "env": spec["env"], "cwd": os.getcwd(),
                              "death_signal": int(signal.SIGKILL)}).encode("utf-8")
        sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                  array.array("i", [1, 2]))])
        pid = int(json.loads(sock.recv(4096).decode("utf-8"))["started"])
    except (OSError, ValueError, KeyError, TypeError):
        sock.close()
        return None
    sock.settimeout(None)
    pid_file = spec.get("pid_file")  # for the host's probe
    if pid_file:
        try:
            with open(pid_file, "w") as out:
                out.write(str(pid))
        except OSError:
            pid_file = None
    return Forked(sock, pid, pid_file)


def wait(child):
    """Waits for the command, then kills what it left in its group, then reaps it."""
    if isinstance(child, Forked):  # reaped by the template already
        code = child.wait()
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            pass
        if child.pid_file:
            try:
                os.unlink(child.pid_file)
            except OSError:
                pass
        return code
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


def detach(spec):
    """Starts the command to outlive this channel; prints its pid."""
    try:
        os.chdir(spec["cwd"])
    except OSError as exc:
        fail("cannot change to directory %r: %s" % (spec["cwd"], exc.strerror), 127)
    tmp = spec["env"].get("TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    log = os.path.join(tmp, spec["detach"])  # if relative
    try:
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND
                      | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError:
        out = os.open(os.devnull, os.O_WRONLY)
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        child = subprocess.Popen(spec["command"], env=spec["env"], stdin=devnull, stdout=out,
                                 stderr=out, close_fds=True, start_new_session=True)
    except OSError as exc:
        fail("cannot start %r: %s" % (spec["command"][0], exc.strerror or exc), 127)
    sys.stdout.write("started %d\n" % child.pid)
    sys.stdout.flush()
    os._exit(0)


def main():
    stdin = Stdin()
    first = stdin.line()
    if first is None:
        os._exit(EOF_CODE)
    spec = json.loads(first.decode("utf-8"))
    if spec.get("detach"):
        detach(spec)
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
TEMPLATE_WAIT_S = 10.0
main()
'''


@functools.lru_cache(maxsize=8)
def remote_command(python: str) -> str:
    """`exec <python> -c '<loader>'`: one line, the same for every worker, no secrets."""
    packed = base64.b64encode(zlib.compress(BOOTSTRAP.encode(), 9)).decode("ascii")
    loader = f"import base64,zlib;exec(zlib.decompress(base64.b64decode('{packed}')))"
    return f"exec {shlex.quote(python)} -c {shlex.quote(loader)}"


