"""Pieces shared by the SSH test fixtures: keys, sshd configuration, process trees."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path


def keygen(path: Path) -> str:
    """A new ed25519 key pair at `path`; returns the public key's "type base64" part."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def sshd_config(port: int, listen: str, host_key: Path, authorized_keys: Path,
                pid_file: Path, session_home: Path, max_sessions: int | None = None) -> str:
    """A key-only sshd configuration for root logins in tests.

    Sessions get `session_home` as HOME (made here, empty): their shells do not run this
    machine's own ~/.bashrc, which may do anything (pyenv's rehash takes a lock in root's home;
    a test that kills a host mid-startup left it behind once, and every later session waited
    60 s for it)."""
    session_home.mkdir(parents=True, exist_ok=True)
    lines = [
        f"Port {port}",
        f"ListenAddress {listen}",
        f"HostKey {host_key}",
        f"AuthorizedKeysFile {authorized_keys}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "UseDNS no",
        f"PidFile {pid_file}",
        f"SetEnv HOME={session_home}",
        "LogLevel ERROR",
    ]
    if max_sessions is not None:
        lines.append(f"MaxSessions {max_sessions}")
    return "\n".join(lines) + "\n"


def descendants(pid: int) -> list[int]:
    """Every process below `pid` in the process tree."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stop_tree(proc: subprocess.Popen[bytes]) -> None:
    """Ends `proc` (SIGTERM, SIGKILL after 5 s) and every process it had started."""
    leftovers = descendants(proc.pid)
    proc.terminate()
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    kill_all(leftovers + descendants(proc.pid))


def kill_all(pids: Sequence[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
