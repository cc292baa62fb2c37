"""Floors of the recovery benchmark's phases, measured with raw torch.distributed (no
elasticrun) on the same machine in the same run.

`python recovery_floors.py MB TRIALS` prints one JSON object:
  death_s   a raw Gloo peer-death probe: 2 ranks over a TCPStore; rank 1 holds MB MiB of
            anonymous memory in all, as the killed worker did (the kernel frees it before the
            process's sockets close), and is SIGKILLed while rank 0 waits in a recv from it;
            seconds from the kill to rank 0's recv failing (medians over TRIALS)
  exit_s    the same kill, seen as the process's exit by its parent (os.waitpid)
  build_s   a 2-rank Gloo group built through torch's TCPStore, plus one allreduce
Roles: `python recovery_floors.py --rank R PORT MB` (internal).
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import time

from kit import anonymous_mb, free_port

TIMEOUT = datetime.timedelta(seconds=30)


def _role(rank: int, port: int, megabytes: int) -> None:
    import torch
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=TIMEOUT)
    start = time.perf_counter()
    group = dist.ProcessGroupGloo(dist.PrefixStore("build/", store), rank, 2, TIMEOUT)
    group.allreduce([torch.ones(4)]).wait()
    build_s = time.perf_counter() - start
    if rank == 1:  # up to `megabytes` of anonymous memory in all, like the killed worker
        ballast = torch.ones(max(0, megabytes - anonymous_mb()) * 262144)  # noqa: F841
        print("ready", flush=True)
        time.sleep(600)
        return
    print("ready", flush=True)
    try:
        group.recv([torch.zeros(1)], 1, 0).wait()
    except RuntimeError:
        pass
    print(json.dumps({"failed_at": time.time(), "build_s": build_s}), flush=True)


def _trial(megabytes: int) -> dict[str, float]:
    port = free_port()
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), str(port),
                               str(megabytes)], stdout=subprocess.PIPE, text=True)
             for r in (0, 1)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.2)  # rank 0 is in its recv
        killed = time.time()
        os.kill(procs[1].pid, signal.SIGKILL)
        procs[1].wait(30)
        exited = time.time()
        assert procs[0].stdout is not None
        seen = json.loads(procs[0].stdout.readline())
        return {"death_s": seen["failed_at"] - killed, "exit_s": exited - killed,
                "build_s": seen["build_s"]}
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(30)


def main() -> None:
    if sys.argv[1] == "--rank":
        _role(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        return
    megabytes, trials = int(sys.argv[1]), int(sys.argv[2])
    runs = [_trial(megabytes) for _ in range(trials)]
    print(json.dumps({key: statistics.median(run[key] for run in runs) for key in runs[0]}))


if __name__ == "__main__":
    main()
