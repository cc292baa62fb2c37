#!/usr/bin/env python3
"""elasticrun host discovery: the ready pods matching a Kubernetes label selector.

Runs `kubectl get pods -l SELECTOR [-n NAMESPACE] -o json` and prints one
`address:slots` line per pod that is Running, has condition Ready=True and is
not being deleted (a terminating pod is how a scale-down shows up), sorted by
pod name. The address is the pod IP, or with `--address name` the pod name plus
`--domain` (for a headless Service: .SERVICE.NAMESPACE.svc.cluster.local).
Slots come from the pod annotation `elasticrun.io/slots`, else --default-slots.

Configuration (elasticrun runs the script without arguments, so flags default
to environment variables):
  --selector SEL          ELASTICRUN_K8S_SELECTOR          label selector (required)
  --namespace NS          ELASTICRUN_K8S_NAMESPACE         default: kubectl's current one
  --context CTX           ELASTICRUN_K8S_CONTEXT           kubeconfig context
  --address ip|name       ELASTICRUN_K8S_ADDRESS           default ip
  --domain SUFFIX         ELASTICRUN_K8S_DOMAIN            appended to pod names
  --slots-annotation KEY  ELASTICRUN_K8S_SLOTS_ANNOTATION  default elasticrun.io/slots
  --default-slots N       ELASTICRUN_K8S_DEFAULT_SLOTS     default 1
  --kubectl PATH          ELASTICRUN_KUBECTL               default kubectl
  --timeout SECONDS       ELASTICRUN_K8S_TIMEOUT           bound on kubectl, default 8

Example:
  ELASTICRUN_K8S_SELECTOR=job=train elasticrun -np 4 --min-np 2 \\
      --host-discovery-script discovery_scripts/kubernetes.py python train.py

Exit codes: 0 hosts printed; 2 bad configuration; 3 kubectl not found; 4 kubectl
failed, timed out or printed something unexpected. Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import subprocess
import sys
from typing import Any, NoReturn

PROG = "kubernetes.py"
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


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def is_ready(pod: dict[str, Any]) -> bool:
    """Running, Ready=True and not terminating."""
    status = _dict(pod.get("status"))
    if _dict(pod.get("metadata")).get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    conditions = status.get("conditions")
    return any(_dict(c).get("type") == "Ready" and _dict(c).get("status") == "True"
               for c in (conditions if isinstance(conditions, list) else []))


def pod_line(pod: dict[str, Any], args: argparse.Namespace, default_slots: int) -> str | None:
    """`address:slots` for one ready pod; None when it has no IP yet."""
    meta = _dict(pod.get("metadata"))
    name = str(meta.get("name") or "")
    raw = _dict(meta.get("annotations")).get(args.slots_annotation)
    try:
        slots = default_slots if raw is None else slots_value(str(raw))
    except ValueError as exc:
        fail(4, f"pod {name}: annotation {args.slots_annotation}: {exc}")
    if args.address == "name":
        host = name + args.domain
        if len(host) > 253 or not _NAME.match(host):
            fail(4, f"pod {name!r}: {host!r} is not a valid host name")
        return f"{host}:{slots}"
    address = _dict(pod.get("status")).get("podIP")
    if not address:
        return None
    try:
        ip = ipaddress.ip_address(str(address))
    except ValueError:
        fail(4, f"pod {name}: status.podIP {address!r} is not an IP address")
    return f"[{ip}]:{slots}" if ip.version == 6 else f"{ip}:{slots}"


def main() -> int:
    parser = _Parser(prog=PROG, description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)

    def flag(name: str, env: str, default: str | None = None, **kw: Any) -> None:
        parser.add_argument(name, default=os.environ.get(env) or default,
                            help=f"[env {env}]", **kw)

    flag("--selector", "ELASTICRUN_K8S_SELECTOR")
    flag("--namespace", "ELASTICRUN_K8S_NAMESPACE")
    flag("--context", "ELASTICRUN_K8S_CONTEXT")
    flag("--address", "ELASTICRUN_K8S_ADDRESS", "ip")
    flag("--domain", "ELASTICRUN_K8S_DOMAIN", "")
    flag("--slots-annotation", "ELASTICRUN_K8S_SLOTS_ANNOTATION", "elasticrun.io/slots")
    flag("--default-slots", "ELASTICRUN_K8S_DEFAULT_SLOTS", "1")
    flag("--kubectl", "ELASTICRUN_KUBECTL", "kubectl")
    flag("--timeout", "ELASTICRUN_K8S_TIMEOUT", "8")
    args = parser.parse_args()

    if not args.selector:
        fail(2, "no label selector; set ELASTICRUN_K8S_SELECTOR or pass --selector, e.g. job=train")
    if args.address not in ("ip", "name"):
        fail(2, f"--address / ELASTICRUN_K8S_ADDRESS must be 'ip' or 'name', got {args.address!r}")
    if args.domain and args.address != "name":
        fail(2, "--domain / ELASTICRUN_K8S_DOMAIN only applies with --address name")
    if args.domain and not args.domain.startswith("."):
        args.domain = "." + args.domain
    try:
        default_slots = slots_value(args.default_slots)
    except ValueError as exc:
        fail(2, f"--default-slots / ELASTICRUN_K8S_DEFAULT_SLOTS: {exc}")
    try:
        timeout = float(args.timeout)
        if not 0 < timeout < 1e6:
            raise ValueError
    except ValueError:
        fail(2, f"--timeout / ELASTICRUN_K8S_TIMEOUT must be seconds > 0, got {args.timeout!r}")

    argv = [args.kubectl] + (["--context", args.context] if args.context else [])
    argv += ["get", "pods", "-l", args.selector]
    argv += (["-n", args.namespace] if args.namespace else []) + ["-o", "json"]
    out = run_tool(argv, timeout, "ELASTICRUN_KUBECTL")
    try:
        items = json.loads(out)["items"]
        if not isinstance(items, list):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        fail(4, f"kubectl printed output that is not a JSON pod list: {out.strip()[:80]!r}")

    pods = sorted((_dict(p) for p in items),
                  key=lambda p: str(_dict(p.get("metadata")).get("name")))
    lines = [pod_line(pod, args, default_slots) for pod in pods if is_ready(pod)]
    for line in lines:
        if line is not None:
            print(line)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # last resort: one line, never a traceback
        fail(1, f"unexpected error: {exc!r}")
