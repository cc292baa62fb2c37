#!/usr/bin/env python3
"""elasticrun host discovery: the healthy, in-service instances of an AWS Auto Scaling group.

Runs `aws autoscaling describe-auto-scaling-groups` for the group, keeps the
instances with LifecycleState InService and HealthStatus Healthy (Pending,
Terminating, Terminating:Wait, ... are left out), looks up their private
addresses with `aws ec2 describe-instances`, and prints one `address:slots`
line per running instance, sorted by instance id. Credentials and the default
region come from the AWS CLI's usual configuration (AWS_PROFILE, instance role...).

Configuration (elasticrun runs the script without arguments, so flags default
to environment variables):
  --group NAME       ELASTICRUN_ASG_NAME      Auto Scaling group name (required)
  --region REGION    AWS_REGION               default: the AWS CLI's configured region
  --address ip|dns   ELASTICRUN_ASG_ADDRESS   PrivateIpAddress (default) or PrivateDnsName
  --slots N          ELASTICRUN_ASG_SLOTS     slots per instance, default 1
  --aws PATH         ELASTICRUN_AWS_CLI       default aws
  --timeout SECONDS  ELASTICRUN_ASG_TIMEOUT   bound on both aws calls together, default 8

Example:
  ELASTICRUN_ASG_NAME=train-workers ELASTICRUN_ASG_SLOTS=8 elasticrun -np 32 --min-np 8 \\
      --host-discovery-script discovery_scripts/aws_asg.py python train.py

Exit codes: 0 hosts printed; 2 bad configuration; 3 aws CLI not found; 4 aws failed,
timed out, printed something unexpected or found no such group. Errors are one line
on stderr.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import subprocess
import sys
import time
from typing import Any, NoReturn

PROG = "aws_asg.py"
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


def run_aws(argv: list[str], deadline: float, limit: float) -> Any:
    """Runs one aws command before deadline; its JSON output, or exit 3/4 with one line."""
    what = " ".join(argv[:3])
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=dict(os.environ, AWS_PAGER=""))
    except FileNotFoundError:
        where = "no such file" if os.sep in argv[0] else "not found on PATH"
        fail(3, f"{argv[0]} {where}; install the AWS CLI or set ELASTICRUN_AWS_CLI")
    except OSError as exc:
        fail(3, f"cannot run {argv[0]}: {exc.strerror or exc}; check ELASTICRUN_AWS_CLI")
    try:
        out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        fail(4, f"{what} gave no answer within the {limit:g}s limit")
    if proc.returncode != 0:
        lines = [line.strip() for line in err.decode(errors="replace").splitlines()]
        reason = next((line for line in reversed(lines) if line), "no message")
        fail(4, f"{what} failed (exit code {proc.returncode}): {reason[:300]}")
    try:
        return json.loads(out)
    except ValueError:
        fail(4, f"{what} printed output that is not JSON: {out.decode(errors='replace')[:80]!r}")


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def main() -> int:
    parser = _Parser(prog=PROG, description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)

    def flag(name: str, env: str, default: str | None = None) -> None:
        parser.add_argument(name, default=os.environ.get(env) or default, help=f"[env {env}]")

    flag("--group", "ELASTICRUN_ASG_NAME")
    flag("--region", "AWS_REGION")
    flag("--address", "ELASTICRUN_ASG_ADDRESS", "ip")
    flag("--slots", "ELASTICRUN_ASG_SLOTS", "1")
    flag("--aws", "ELASTICRUN_AWS_CLI", "aws")
    flag("--timeout", "ELASTICRUN_ASG_TIMEOUT", "8")
    args = parser.parse_args()

    if not args.group:
        fail(2, "no Auto Scaling group; set ELASTICRUN_ASG_NAME or pass --group NAME")
    if args.address not in ("ip", "dns"):
        fail(2, f"--address / ELASTICRUN_ASG_ADDRESS must be 'ip' or 'dns', got {args.address!r}")
    try:
        slots = slots_value(args.slots)
    except ValueError as exc:
        fail(2, f"--slots / ELASTICRUN_ASG_SLOTS: {exc}")
    try:
        limit = float(args.timeout)
        if not 0 < limit < 1e6:
            raise ValueError
    except ValueError:
        fail(2, f"--timeout / ELASTICRUN_ASG_TIMEOUT must be seconds > 0, got {args.timeout!r}")
    deadline = time.monotonic() + limit
    tail = ["--output", "json"] + (["--region", args.region] if args.region else [])

    found = run_aws([args.aws, "autoscaling", "describe-auto-scaling-groups",
                     "--auto-scaling-group-names", args.group] + tail, deadline, limit)
    if not isinstance(found, dict) or not isinstance(found.get("AutoScalingGroups"), list):
        fail(4, "aws autoscaling describe-auto-scaling-groups printed unexpected JSON")
    groups = _dicts(found["AutoScalingGroups"])
    if not groups:
        fail(4, f"no Auto Scaling group named {args.group!r}"
                + (f" in region {args.region}" if args.region else ""))
    ids = sorted({str(i.get("InstanceId")) for g in groups for i in _dicts(g.get("Instances"))
                  if i.get("LifecycleState") == "InService" and i.get("HealthStatus") == "Healthy"
                  and i.get("InstanceId")})
    if not ids:
        return 0

    described = run_aws([args.aws, "ec2", "describe-instances", "--instance-ids", *ids] + tail,
                        deadline, limit)
    if not isinstance(described, dict) or not isinstance(described.get("Reservations"), list):
        fail(4, "aws ec2 describe-instances printed unexpected JSON")
    addresses: dict[str, str] = {}
    for instance in (i for r in _dicts(described["Reservations"])
                     for i in _dicts(r.get("Instances"))):
        state = instance.get("State")
        if not isinstance(state, dict) or state.get("Name") != "running":
            continue
        key = "PrivateIpAddress" if args.address == "ip" else "PrivateDnsName"
        address = instance.get(key)
        if not address:
            continue
        if args.address == "ip":
            try:
                ip = ipaddress.ip_address(str(address))
            except ValueError:
                fail(4, f"instance {instance.get('InstanceId')}: {key} {address!r} is not an IP")
            address = f"[{ip}]" if ip.version == 6 else str(ip)
        elif len(address) > 253 or not _NAME.match(str(address)):
            fail(4, f"instance {instance.get('InstanceId')}: {key} {address!r} is not a host name")
        addresses[str(instance.get("InstanceId"))] = address
    for instance_id in ids:
        if instance_id in addresses:
            print(f"{addresses[instance_id]}:{slots}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # last resort: one line, never a traceback
        fail(1, f"unexpected error: {exc!r}")
