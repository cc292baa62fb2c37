"""A real sshd on 127.0.0.1 for the SSH launcher tests, with its own keys and files."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.harness import free_port
from tests.ssh.sshd import keygen, sshd_config, stop_tree

SSHD = Path("/usr/sbin/sshd")
MAX_SESSIONS = 3  # low, so that the tests also cover opening a second connection


@dataclass(frozen=True)
class SSHServer:
    port: int
    root: Path
    host_key_pub: str  # "ssh-ed25519 AAAA..."
    client_key: Path
    known_hosts: Path  # holds the server's key
    empty_config: Path

    max_sessions: int = MAX_SESSIONS

    @property
    def session_home(self) -> Path:
        """HOME of the sessions' shells: a test may put a ~/.bashrc there (and removes it)."""
        return self.root / "session_home"

    def known_hosts_line(self, key_pub: str | None = None) -> str:
        return f"[127.0.0.1]:{self.port} {key_pub or self.host_key_pub}\n"

    @staticmethod
    def keygen(path: Path) -> str:
        return keygen(path)

    @staticmethod
    def free_port() -> int:
        return free_port()


def _missing_tools() -> str | None:
    if not SSHD.exists():
        return f"{SSHD} is not installed (apt-get install openssh-server)"
    if shutil.which("ssh-keygen") is None:
        return "ssh-keygen is not installed"
    if os.geteuid() != 0:
        return "the test sshd needs root (privilege separation directory, login as root)"
    return None



def _write_config(root: Path, port: int) -> Path:
    config = root / "sshd_config"
    config.write_text(sshd_config(port, "127.0.0.1", root / "host_key",
                                  root / "authorized_keys", root / "sshd.pid",
                                  root / "session_home", MAX_SESSIONS))
    return config


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.skip(f"sshd did not start: {log.read_text(errors='replace').strip()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    pytest.skip("sshd did not accept connections within 10s")


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHServer]:
    reason = _missing_tools()
    if reason is not None:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("sshd")
    host_pub = keygen(root / "host_key")
    client_pub = keygen(root / "client_key")
    (root / "authorized_keys").write_text(client_pub + "\n")
    port = free_port()
    config = _write_config(root, port)
    Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
    log = root / "sshd.log"
    with open(log, "wb") as log_file:
        proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)],
                                stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        _wait_for_port(port, proc, log)
        known_hosts = root / "known_hosts"
        server = SSHServer(port=port, root=root, host_key_pub=host_pub,
                           client_key=root / "client_key", known_hosts=known_hosts,
                           empty_config=root / "ssh_config")
        known_hosts.write_text(server.known_hosts_line())
        server.empty_config.write_text("")
        yield server
    finally:
        _stop_sshd(proc)


def _stop_sshd(proc: subprocess.Popen[bytes]) -> None:
    """Ends the listener and every session process it forked."""
    stop_tree(proc)
