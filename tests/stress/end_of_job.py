"""Stress loop: does the launcher, and everything it started, end with the job?

Runs a Horovod-style scenario (one slot per host; discovery replaces hosts at every epoch:
A,B then B,C then C,D) many times, reading the launcher's output through pipes as a caller
would, and prints for each run the time from the driver's last word to the launcher's exit
and to EOF on its pipes, and any process of the job still alive at EOF.

    python -m tests.stress.end_of_job --runs 30 [--interval 0.01] [--load 1] [--code DIR]

--load N keeps N busy-looping processes running beside the jobs (a busy machine); --code DIR
runs another checkout's elasticrun (the scenario then needs --wait 0 if that one predates
Horovod's `state._host_messages`). Exits 1 if any run ended late or left a process behind.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
from pathlib import Path

from tests.integration import horovod_style
from tests.integration.harness import REPO
from tests.integration.job_end import run_and_time_end

HOSTS = ["localhost", "127.0.0.1", "127.0.0.2", "127.0.0.3"]
SCHEDULE: horovod_style.Schedule = [(0, HOSTS[0:2]), (1, HOSTS[1:3]), (None, HOSTS[2:4])]


def _busy() -> None:
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--wait", type=float, default=10.0,
                        help="seconds rank 0 waits for each host-change notice")
    parser.add_argument("--interval", type=float, default=0.1,
                        help="--discovery-interval (a short one polls discovery all the time)")
    parser.add_argument("--load", type=int, default=0)
    parser.add_argument("--late", type=float, default=5.0)
    parser.add_argument("--deadline", type=float, default=180.0)
    parser.add_argument("--code", type=Path, default=REPO,
                        help="the elasticrun checkout the jobs run (to compare with another)")
    options = parser.parse_args()
    hogs = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(options.load)]
    for hog in hogs:
        hog.start()
    bad = 0
    try:
        for number in range(1, options.runs + 1):
            with tempfile.TemporaryDirectory() as workdir:
                args, _ = horovod_style.command(
                    Path(workdir), SCHEDULE, np=2, min_np=2, max_np=4,
                    flags=["--discovery-interval", str(options.interval)],
                    script_args=["--discovery-wait", str(options.wait)])
                end = run_and_time_end(args, deadline=options.deadline,
                                       pythonpath=options.code.resolve())
            late = end.lateness > options.late or bool(end.left)
            bad += late
            shown = [f"{w:.2f}s" if w is not None else "never"
                     for w in (end.after_end(end.exited), end.after_end(end.eof))]
            print(f"run {number:3d}: exit code {end.code}, last word -> exit {shown[0]}, "
                  f"-> EOF {shown[1]}, left {end.left}{'  <-- LATE' if late else ''}",
                  flush=True)
            if late:
                print("    " + "\n    ".join(end.output[-8:] + end.stack.splitlines()),
                      flush=True)
    finally:
        for hog in hogs:
            hog.terminate()
    print(f"{options.runs - bad} of {options.runs} runs ended on time with nothing left")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
