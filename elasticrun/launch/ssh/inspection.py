"""Asking an SSH host what a worker's process is doing, when the worker may be hung.

A second session channel on the worker's connection runs one grep (no interpreter to start:
it must answer quickly on a loaded host): it finds the processes whose environment holds
the worker's ELASTICRUN_WORKER_ID (or, forked by the host's template, whose pid its bootstrap
wrote down) and prints their /proc/PID/stat lines; the worker is the
one that leads its own session. A connection that does not open the channel within the
bound (a frozen host, a cut link) makes the host unreachable. A host whose sshd opened it
answered: if the probe then does not finish in time (the user's login shell runs their
~/.bashrc first, which may take seconds: conda, pyenv), or sshd refuses another session
(MaxSessions), the host cannot tell.
"""

from __future__ import annotations

import shlex
import time

import paramiko

from elasticrun.launch.ssh.connect import _one_line
from elasticrun.system.process_view import ProcessState, ProcessView, stat_fields, view_of_state

MAX_ANSWER_BYTES = 64 * 1024


def probe_command(worker_id: str, pid_file: str = "") -> str:
    """Prints the /proc/PID/stat of the processes with the worker's id in their environment
    and of the pid in `pid_file` (a worker forked by its host's template)."""
    variable = shlex.quote(f"ELASTICRUN_WORKER_ID={worker_id}")
    forked = f"p=$(cat {shlex.quote(pid_file)} 2>/dev/null) && echo /proc/$p/environ; " \
        if pid_file else ""
    return (f"{{ grep -l -a -z -x -F {variable} /proc/[0-9]*/environ 2>/dev/null; {forked}}} | "
            "while read -r f; do p=${f#/proc/}; cat /proc/${p%/environ}/stat 2>/dev/null; "
            "echo; done")


def worker_state(answer: str) -> ProcessView:
    """The view of the session leader among the /proc/PID/stat lines of `answer`."""
    for line in answer.splitlines():
        pid, _, rest = line.partition(" (")
        fields = stat_fields(rest)
        if len(fields) > 3 and fields[3] == pid.strip():  # it leads its own session
            return view_of_state(fields[0])
    return ProcessView(ProcessState.GONE)


def inspect_over_ssh(transport: paramiko.Transport, worker_id: str,
                     timeout: float, pid_file: str = "") -> ProcessView:
    """Blocking: the state of worker `worker_id`'s process on the host behind `transport`,
    decided within `timeout` seconds of the call (the exec request's reply apart: a link
    cut just then is bounded by the caller)."""
    deadline = time.monotonic() + timeout
    try:
        channel = transport.open_session(timeout=timeout)
    except paramiko.ChannelException as exc:
        return ProcessView(ProcessState.UNKNOWN, f"no SSH session for the probe: {exc}")
    except (paramiko.SSHException, OSError, EOFError) as exc:
        return ProcessView(ProcessState.UNREACHABLE, _one_line(exc))
    try:
        channel.exec_command(probe_command(worker_id, pid_file))
    except (paramiko.SSHException, OSError, EOFError) as exc:
        channel.close()
        return ProcessView(ProcessState.UNREACHABLE, _one_line(exc))
    try:
        answer = b""
        while True:
            channel.settimeout(max(0.0, deadline - time.monotonic()))
            chunk = channel.recv(MAX_ANSWER_BYTES)
            if not chunk:
                break
            answer += chunk
            if len(answer) > MAX_ANSWER_BYTES:
                return ProcessView(ProcessState.UNKNOWN, "the probe said too much")
    except TimeoutError:
        return ProcessView(ProcessState.UNKNOWN, "its host answered, but the probe did not "
                           f"finish within {timeout:g}s (a slow login shell?)")
    except (paramiko.SSHException, OSError, EOFError) as exc:
        return ProcessView(ProcessState.UNREACHABLE, _one_line(exc))
    finally:
        channel.close()
    return worker_state(answer.decode(errors="replace"))
