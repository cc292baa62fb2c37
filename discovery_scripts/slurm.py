#!/usr/bin/env python3
"""elasticrun host discovery: the nodes of the current Slurm job.

Expands the job's node list with `scontrol show hostnames NODELIST` and prints
one `host:slots` line per node, in Slurm's order. Run elasticrun inside the
allocation (sbatch or salloc), where Slurm sets SLURM_JOB_NODELIST.

Configuration (elasticrun runs the script without arguments, so flags default
to environment variables):
  --nodelist LIST    SLURM_JOB_NODELIST    compressed node list, e.g. gpu[01-04]
  --slots N          ELASTICRUN_SLURM_SLOTS, else SLURM_NTASKS_PER_NODE when it is a
                     plain number, else 1
  --scontrol PATH    ELASTICRUN_SCONTROL   default scontrol
  --timeout SECONDS  ELASTICRUN_SLURM_TIMEOUT   bound on scontrol, default 8

Example (in an sbatch script with --ntasks-per-node=4):
  elasticrun -np 16 --min-np 8 \\
      --host-discovery-script discovery_scripts/slurm.py python train.py

Exit codes: 0 hosts printed; 2 bad configuration or not inside a Slurm allocation;
3 scontrol not found; 4 scontrol failed, timed out or printed something unexpected.
Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from typing import NoReturn

PROG = "slurm.py"
MAX_SLOTS = 4096
_NAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9._-]*[A-Za-z0-9_])?$")


def fail(code: int, message: str) -> NoReturn:
    print(f"{PROG}: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(code)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        fail(2, message)


def slots_value(text: str) -> int:
    """A slot count 0..MAX_SLOTS, or ValueError."""
    if not re.fullmatch(r"[0-9]{1,5}", text.strip()) or int(text) > MAX_SLOTS:
        raise ValueError(f"expected a whole number between 0 and {MAX_SLOTS}, got {text!r}")
    return int(text)


def run_tool(argv: list[str], timeout: float, env_name: str) -> str:
    """Runs a tool, bounded by timeout; its stdout, or exit 3/4 with one line."""
    tool = argv[0]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    except FileNotFoundError:
        where = "no such file" if os.sep in tool else "not found on PATH"
        fail(3, f"{tool} {where}; install it or set {env_name}")
    except OSError as exc:
        fail(3, f"cannot run {tool}: {exc.strerror or exc}; check {env_name}")
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        fail(4, f"{' '.join(argv[:3])} gave no answer within {timeout:g}s")
    if proc.returncode != 0:
        lines = [line.strip() for line in err.decode(errors="replace").splitlines()]
        reason = next((line for line in reversed(lines) if line), "no message")
        fail(4, f"{' '.join(argv[:3])} failed (exit code {proc.returncode}): {reason[:300]}")
    return out.decode(errors="replace")


def main() -> int:
    parser = _Parser(prog=PROG, description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodelist", default=os.environ.get("SLURM_JOB_NODELIST")
                        or os.environ.get("SLURM_NODELIST") or None,
                        help="[env SLURM_JOB_NODELIST]")
    parser.add_argument("--slots", default=os.environ.get("ELASTICRUN_SLURM_SLOTS") or None,
                        help="[env ELASTICRUN_SLURM_SLOTS, else SLURM_NTASKS_PER_NODE, else 1]")
    parser.add_argument("--scontrol", default=os.environ.get("ELASTICRUN_SCONTROL") or "scontrol",
                        help="[env ELASTICRUN_SCONTROL]")
    parser.add_argument("--timeout", default=os.environ.get("ELASTICRUN_SLURM_TIMEOUT") or "8",
                        help="[env ELASTICRUN_SLURM_TIMEOUT]")
    args = parser.parse_args()

    if not args.nodelist:
        fail(2, "not inside a Slurm allocation: SLURM_JOB_NODELIST is not set "
                "(run under sbatch/salloc, or pass --nodelist)")
    if args.slots is not None:
        try:
            slots = slots_value(args.slots)
        except ValueError as exc:
            fail(2, f"--slots / ELASTICRUN_SLURM_SLOTS: {exc}")
    else:
        try:
            slots = slots_value(os.environ.get("SLURM_NTASKS_PER_NODE", ""))
        except ValueError:
            slots = 1
    try:
        timeout = float(args.timeout)
        if not 0 < timeout < 1e6:
            raise ValueError
    except ValueError:
        fail(2, f"--timeout / ELASTICRUN_SLURM_TIMEOUT must be seconds > 0, got {args.timeout!r}")

    out = run_tool([args.scontrol, "show", "hostnames", args.nodelist], timeout,
                   "ELASTICRUN_SCONTROL")
    hosts = [line.strip() for line in out.splitlines() if line.strip()]
    for host in hosts:
        if len(host) > 253 or not _NAME.match(host):
            fail(4, f"scontrol show hostnames printed {host[:60]!r}, which is not a host name")
    if not hosts:
        fail(4, f"scontrol show hostnames printed no hosts for node list {args.nodelist!r}")
    for host in dict.fromkeys(hosts):
        print(f"{host}:{slots}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # last resort: one line, never a traceback
        fail(1, f"unexpected error: {exc!r}")
