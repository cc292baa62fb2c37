#!/usr/bin/env python3
"""elasticrun host discovery: the hosts listed in a file, re-read on every poll.

Edit the file while the job runs to add or remove hosts. Accepted lines:
  host            node1            (slots: --default-slots, else elasticrun's --slots-per-host)
  host:slots      node1:4
  host slots=N    node1 slots=4    (MPI hostfile style; max_slots=N is read the same way)
  [ipv6]:slots    [fe80::1]:4
Blank lines and `#` comments are ignored. Output is one normalized `host:slots`
line per host (a host listed twice keeps its first position and its last count).

Configuration (elasticrun runs the script without arguments, so flags default
to environment variables):
  --file PATH          ELASTICRUN_HOSTS_FILE                 the hosts file (required)
  --default-slots N    ELASTICRUN_HOSTS_FILE_DEFAULT_SLOTS   slots for lines without a count

Example:
  ELASTICRUN_HOSTS_FILE=/shared/hosts.txt elasticrun -np 8 --min-np 4 \\
      --host-discovery-script discovery_scripts/static_file.py python train.py

Exit codes: 0 hosts printed; 2 bad configuration; 3 file missing or unreadable;
4 a line is not a valid host entry. Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import sys
from typing import NoReturn

PROG = "static_file.py"
MAX_SLOTS = 4096
_NAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9._-]*[A-Za-z0-9_])?$")
_SLOTS_WORD = re.compile(r"^(?:max_)?slots=(\S+)$")


def fail(code: int, message: str) -> NoReturn:
    print(f"{PROG}: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(code)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        fail(2, message)


def slots_value(text: str) -> int:
    """A slot count 0..MAX_SLOTS, or ValueError."""
    if not re.fullmatch(r"[0-9]{1,5}", text) or int(text) > MAX_SLOTS:
        raise ValueError(f"slots must be a whole number between 0 and {MAX_SLOTS}, got {text!r}")
    return int(text)


def parse_entry(entry: str) -> tuple[str, int | None]:
    """One hosts-file entry -> (host as printed, slots or None). Raises ValueError."""
    words = entry.split()
    slots: int | None = None
    if len(words) == 2:
        match = _SLOTS_WORD.match(words[1])
        if not match:
            raise ValueError("expected 'host', 'host:slots' or 'host slots=N'")
        host, slots = words[0], slots_value(match.group(1))
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
    elif len(words) != 1:
        raise ValueError("expected one host per line, like 'host:slots'")
    elif entry.startswith("["):
        host, sep, rest = entry[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError("expected '[ipv6-address]:slots'")
        slots = slots_value(rest[1:]) if rest else None
    elif entry.count(":") > 1:
        host = entry
    else:
        host, sep, count = entry.partition(":")
        slots = slots_value(count) if sep else None
    if ":" in host:
        try:
            return f"[{ipaddress.IPv6Address(host)}]", slots
        except ValueError:
            raise ValueError(f"not a valid IPv6 address: {host!r}") from None
    if len(host) > 253 or not _NAME.match(host):
        raise ValueError(f"not a valid host name or address: {host!r}")
    return host, slots


def main() -> int:
    parser = _Parser(prog=PROG, description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--file", default=os.environ.get("ELASTICRUN_HOSTS_FILE") or None,
                        help="hosts file [env ELASTICRUN_HOSTS_FILE]")
    parser.add_argument("--default-slots",
                        default=os.environ.get("ELASTICRUN_HOSTS_FILE_DEFAULT_SLOTS") or None,
                        help="slots for lines without a count (default: print the bare host, "
                             "elasticrun's --slots-per-host applies) "
                             "[env ELASTICRUN_HOSTS_FILE_DEFAULT_SLOTS]")
    args = parser.parse_args()
    if not args.file:
        fail(2, "no hosts file given; set ELASTICRUN_HOSTS_FILE or pass --file PATH")
    default: int | None = None
    if args.default_slots is not None:
        try:
            default = slots_value(args.default_slots)
        except ValueError as exc:
            fail(2, f"--default-slots / ELASTICRUN_HOSTS_FILE_DEFAULT_SLOTS: {exc}")
    try:
        with open(args.file, encoding="utf-8") as handle:
            text = handle.read()
    except UnicodeDecodeError:
        fail(4, f"hosts file {args.file} is not UTF-8 text")
    except OSError as exc:
        fail(3, f"cannot read hosts file {args.file}: {exc.strerror or exc}")
    hosts: dict[str, int | None] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        entry = raw.split("#", 1)[0].strip()
        if not entry:
            continue
        try:
            host, slots = parse_entry(entry)
        except ValueError as exc:
            fail(4, f"{args.file}:{number}: {entry[:60]!r}: {exc}")
        hosts[host] = slots if slots is not None else default
    for host, slots in hosts.items():
        print(host if slots is None else f"{host}:{slots}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # last resort: one line, never a traceback
        fail(1, f"unexpected error: {exc!r}")
