"""A small virtual cluster for multi-host tests: network namespaces on one bridge, a real
sshd in each "host" namespace, and elasticrun started inside a "launcher" namespace.

    switch ns:   bridge br0, one veth end per namespace below
    launcher ns: eth0 10.77.0.2/24  (elasticrun runs here)
    host ns i:   eth0 10.77.0.(10+i)/24, sshd on port 22

Every namespace name carries a random suffix, so parallel runs never clash; all addresses
live only inside these namespaces (each cluster has its own bridge), so nothing leaves them.
All namespaces share the PID namespace and file system of the test process: workers are
visible in /proc and run the same Python and repository checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.ssh.sshd import descendants, keygen, kill_all, sshd_config, stop_tree

SSHD = Path("/usr/sbin/sshd")
SUBNET = "10.77.0"
LAUNCHER_IP = f"{SUBNET}.2"
SSH_PORT = 22
IFNAME = "eth0"  # the host-side veth end, in every namespace


def unavailable(sshd: bool = True) -> str | None:
    """Why the cluster (with an sshd per host, or without) cannot be built here; None if it
    can."""
    if os.geteuid() != 0:
        return "network namespaces and a test sshd need root"
    if sshd and not SSHD.exists():
        return f"{SSHD} is not installed (apt-get install openssh-server)"
    for tool in ("ip", "ssh-keygen", "ss") if sshd else ("ip",):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = f"er-probe-{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"'ip netns add' does not work here: {made.stderr.strip()}"
    try:
        bridge = subprocess.run(["ip", "-n", probe, "link", "add", "br0", "type", "bridge"],
                                capture_output=True, text=True)
        if bridge.returncode != 0:
            return f"cannot create a Linux bridge: {bridge.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


@dataclass
class Host:
    """One "machine": a namespace with an address and an sshd."""

    ns: str
    addr: str
    root: Path  # its sshd's files
    host_key_pub: str
    sshd: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        """The host name elasticrun is given: the address, which is not local to the launcher."""
        return self.addr

    def sshd_tree(self) -> list[int]:
        """Every process the sshd forked: session processes, bootstraps, workers."""
        return descendants(self.sshd.pid) if self.sshd is not None else []


@dataclass
class Cluster:
    root: Path
    suffix: str
    switch: str
    launcher: str
    hosts: list[Host] = field(default_factory=list)
    client_key: Path = Path()
    home: Path = Path()

    # --- building and tearing down ----------------------------------------------------------

    @classmethod
    def create(cls, root: Path, n_hosts: int = 3, sshd: bool = True) -> Cluster:
        """`sshd`: a real sshd in each host (the SSH tests); without, bare hosts (agents)."""
        suffix = uuid.uuid4().hex[:6]
        cluster = cls(root=root, suffix=suffix, switch=f"er-{suffix}-sw",
                      launcher=f"er-{suffix}-l")
        try:
            cluster._build(n_hosts, sshd)
        except BaseException:
            cluster.destroy()
            raise
        return cluster

    def _build(self, n_hosts: int, sshd: bool) -> None:
        ip("netns", "add", self.switch)
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        self._plug(self.launcher, "vl", LAUNCHER_IP)
        if sshd:
            self.client_key = self.root / "client_key"
            client_pub = keygen(self.client_key)
            (self.root / "authorized_keys").write_text(client_pub + "\n")
            Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
        for i in range(1, n_hosts + 1):
            ns = f"er-{self.suffix}-h{i}"
            addr = f"{SUBNET}.{10 + i}"
            self._plug(ns, f"vh{i}", addr)
            host_root = self.root / f"h{i}"
            host_root.mkdir()
            host = Host(ns=ns, addr=addr, root=host_root,
                        host_key_pub=keygen(host_root / "host_key") if sshd else "")
            self.hosts.append(host)
            if sshd:
                self._write_sshd_config(host)
                self.start_sshd(host)
        if sshd:
            self.home = self.make_home(self.root / "home")

    def _plug(self, ns: str, switch_end: str, addr: str) -> None:
        """A new namespace `ns` with eth0 at `addr`, its peer on the bridge."""
        ip("netns", "add", ns)
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "link", "add", IFNAME, "type", "veth", "peer", "name", switch_end,
           "netns", self.switch)
        ip("-n", self.switch, "link", "set", switch_end, "master", "br0")
        ip("-n", self.switch, "link", "set", switch_end, "up")
        ip("-n", ns, "addr", "add", f"{addr}/24", "dev", IFNAME)
        ip("-n", ns, "link", "set", IFNAME, "up")

    def destroy(self) -> None:
        """Stops every sshd and everything it started, then deletes every namespace."""
        for host in self.hosts:
            self.stop_sshd(host)
        kill_all(list(self.strays()))  # anything that escaped its sshd's process tree
        existing = ip("netns", "list", check=False).stdout
        for ns in [h.ns for h in self.hosts] + [self.launcher, self.switch]:
            if ns in existing:
                ip("netns", "del", ns, check=False)

    def namespaces(self) -> list[str]:
        return [h.ns for h in self.hosts] + [self.launcher, self.switch]

    # --- sshd ---------------------------------------------------------------------------------

    def _write_sshd_config(self, host: Host) -> None:
        (host.root / "sshd_config").write_text(sshd_config(
            SSH_PORT, host.addr, host.root / "host_key", self.root / "authorized_keys",
            host.root / "sshd.pid", host.root / "session_home"))

    def start_sshd(self, host: Host) -> None:
        log = open(host.root / "sshd.log", "ab")  # noqa: SIM115 - handed to the child
        with log:
            host.sshd = subprocess.Popen(
                ["ip", "netns", "exec", host.ns, str(SSHD), "-D", "-e",
                 "-f", str(host.root / "sshd_config")],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            if host.sshd.poll() is not None:
                raise RuntimeError(f"sshd in {host.ns} did not start: "
                                   f"{(host.root / 'sshd.log').read_text(errors='replace')}")
            listening = ip("netns", "exec", host.ns, "ss", "-Hltn",
                           f"sport = :{SSH_PORT}", check=False).stdout
            if host.addr in listening:
                return
            time.sleep(0.05)
        raise RuntimeError(f"sshd in {host.ns} did not listen within 10s")

    def stop_sshd(self, host: Host) -> None:
        """Ends the listener and every session process (and worker) it forked."""
        if host.sshd is None:
            return
        proc, host.sshd = host.sshd, None
        stop_tree(proc)

    def session_pids(self) -> list[int]:
        """Processes that sshds of this cluster forked (sessions, bootstraps, workers)."""
        return [pid for host in self.hosts for pid in host.sshd_tree()]

    def strays(self) -> dict[int, str]:
        """Live processes in any namespace of the cluster, other than the sshd listeners:
        pid -> "namespace: command line". Empty when no job is running."""
        listeners = {h.sshd.pid for h in self.hosts if h.sshd is not None}
        found = pids_in_namespaces(self.namespaces())
        return {pid: f"{ns}: {cmdline(pid)}" for pid, ns in found.items()
                if pid not in listeners and not is_zombie(pid)}

    def wait_for_no_strays(self, within: float) -> dict[int, str]:
        """Waits until no stray process is left; returns those still there at the end."""
        deadline = time.monotonic() + within
        while (left := self.strays()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    # --- client side --------------------------------------------------------------------------

    def make_home(self, home: Path, keys: dict[str, str] | None = None) -> Path:
        """A HOME for elasticrun: .ssh/config (empty) and .ssh/known_hosts with each host's
        key, or the key given in `keys` for that address (e.g. a wrong one)."""
        keys = keys or {}
        ssh = home / ".ssh"
        ssh.mkdir(parents=True, mode=0o700)
        (ssh / "config").write_text("")
        (ssh / "known_hosts").write_text("".join(
            f"{h.addr} {keys.get(h.addr, h.host_key_pub)}\n" for h in self.hosts))
        return home

    def host(self, addr: str) -> Host:
        return next(h for h in self.hosts if h.addr == addr)

    def set_link(self, host: Host, up: bool) -> None:
        ip("-n", host.ns, "link", "set", IFNAME, "up" if up else "down")

    def black_hole(self, host: Host, on: bool) -> None:
        """On: frames to `host` are silently dropped (its link is down, while the launcher
        still knows its MAC address, so a connect waits for its timeout). Off: undone."""
        if on:
            mac = ip("-n", host.ns, "-br", "link", "show", IFNAME).stdout.split()[2]
            ip("-n", self.launcher, "neigh", "replace", host.addr, "lladdr", mac, "dev",
               IFNAME, "nud", "permanent")
            self.set_link(host, up=False)
        else:
            self.set_link(host, up=True)
            ip("-n", self.launcher, "neigh", "del", host.addr, "dev", IFNAME, check=False)

    def elasticrun(self, args: Sequence[str]) -> list[str]:
        """The command line that runs `elasticrun ARGS` inside the launcher namespace."""
        return ["ip", "netns", "exec", self.launcher, sys.executable, "-m", "elasticrun",
                "--ssh-identity-file", str(self.client_key), *args]


def netns_inode(ns: str) -> int:
    return os.stat(f"/run/netns/{ns}").st_ino


def pids_in_namespaces(namespaces: Sequence[str]) -> dict[int, str]:
    """pid -> namespace name, for every process whose network namespace is one of these."""
    inodes = {netns_inode(ns): ns for ns in namespaces if Path(f"/run/netns/{ns}").exists()}
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            inode = os.stat(entry / "ns" / "net").st_ino
        except OSError:
            continue
        if inode in inodes:
            found[int(entry.name)] = inodes[inode]
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return f"<pid {pid}>"


def is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
