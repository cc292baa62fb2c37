"""Asking an SSH host what a worker's process is doing, when the worker may be hung.

A second session channel on the worker's connection runs a small stdlib probe (the same
interpreter as the bootstrap): it finds the worker among the host's session leaders by its
ELASTICRUN_WORKER_ID and prints the kernel's state letter for it. A connection that does
not answer within the bound (a frozen host, a cut link) makes the host unreachable.
"""

from __future__ import annotations

import json
import shlex

import paramiko

from elasticrun.launch.ssh_connect import _one_line
from elasticrun.process_view import ProcessState, ProcessView, view_of_state

PROBE = r'''
import json, os, sys
wanted, found = set(sys.argv[1:]), {}
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        with open("/proc/%s/stat" % pid, "rb") as stat:
            fields = stat.read().decode("ascii", "replace").rpartition(")")[2].split()
        if fields[3] != pid:  # a worker leads its own session
            continue
        with open("/proc/%s/environ" % pid, "rb") as environ:
            variables = environ.read().split(b"\0")
    except (OSError, IndexError):
        continue
    for variable in variables:
        if variable.startswith(b"ELASTICRUN_WORKER_ID="):
            worker = variable.partition(b"=")[2].decode("utf-8", "replace")
            if worker in wanted:
                found[worker] = fields[0]
            break
sys.stdout.write(json.dumps(found))
'''
MAX_ANSWER_BYTES = 64 * 1024


def inspect_over_ssh(transport: paramiko.Transport, python: str, worker_id: str,
                     timeout: float) -> ProcessView:
    """Blocking: the state of worker `worker_id`'s process on the host behind `transport`."""
    command = f"exec {shlex.quote(python)} -c {shlex.quote(PROBE)} {shlex.quote(worker_id)}"
    try:
        channel = transport.open_session(timeout=timeout)
        try:
            channel.settimeout(timeout)
            channel.exec_command(command)
            answer = b""
            while chunk := channel.recv(MAX_ANSWER_BYTES):
                answer += chunk
                if len(answer) > MAX_ANSWER_BYTES:
                    return ProcessView(ProcessState.UNKNOWN, "the probe said too much")
        finally:
            channel.close()
    except TimeoutError:
        return ProcessView(ProcessState.UNREACHABLE, f"no answer over SSH within {timeout:g}s")
    except (paramiko.SSHException, OSError, EOFError) as exc:
        return ProcessView(ProcessState.UNREACHABLE, _one_line(exc))
    try:
        letters = json.loads(answer or b"{}")
    except ValueError:
        return ProcessView(ProcessState.UNKNOWN, "the probe's answer is not JSON")
    letter = letters.get(worker_id) if isinstance(letters, dict) else None
    return ProcessView(ProcessState.GONE) if letter is None else view_of_state(str(letter))
