"""Prints, as one JSON line, what a worker process sees of itself, then exits as asked.

argv: EXIT (an exit code, "raise" for an uncaught exception, "stop" to wait for SIGTERM)
and anything else (echoed back).
"""

from __future__ import annotations

import json
import os
import sys

import torch

if __name__ == "__main__":
    print(json.dumps({
        "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "argv": sys.argv,
        "path0": sys.path[0], "cwd": os.getcwd(), "name": __name__, "file": __file__,
        "env": dict(os.environ), "stdin": os.readlink("/proc/self/fd/0"),
        "seed": torch.initial_seed(),
    }), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    how = sys.argv[1]
    if how == "raise":
        raise ValueError("a user error")
    if how == "stop":
        sys.stdin.read()  # /dev/null: returns at once; then wait to be stopped
        import time
        time.sleep(60)
    sys.exit(int(how))
