"""A real Slurm cluster on this machine: slurmctld and one slurmd per node, each node in a
network namespace of its own on one bridge, with its own munged.

    switch ns:      bridge br0
    controller ns:  eth0 10.78.0.2/24, slurmctld (the submit host: sbatch, srun, sinfo)
    node ns nI:     eth0 10.78.0.(10+I)/24, `slurmd -N nI`

Everything of the cluster lives under its own directory: slurm.conf (passed to every
daemon and client through SLURM_CONF), munge's key and socket, state, spool, logs.
Daemons start through `nsenter --net=...` (`ip netns exec` remounts /sys, and slurmd then
fails its cgroup check). The addresses are inside namespaces this cluster made; nothing
leaves them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.ssh.netns import cmdline, ip, is_zombie, pids_in_namespaces

SUBNET = "10.78.0"
CONTROLLER_IP = f"{SUBNET}.2"
DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "sinfo", "nsenter")
START_TIMEOUT_S = 30.0


def unavailable() -> str | None:
    """Why a cluster cannot be built here; None if it can."""
    if os.geteuid() != 0:
        return "a Slurm cluster in network namespaces needs root"
    missing = [tool for tool in (*DAEMONS, "mungekey", "ip") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge)"
    probe = f"er-sprobe-{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"'ip netns add' does not work here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass(frozen=True)
class Node:
    name: str  # the Slurm node name, nI
    ns: str
    addr: str


@dataclass
class SlurmCluster:
    root: Path
    suffix: str
    nodes: list[Node] = field(default_factory=list)
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def switch(self) -> str:
        return f"ers-{self.suffix}-sw"

    @property
    def controller(self) -> str:
        return f"ers-{self.suffix}-c"

    @classmethod
    def create(cls, root: Path, n_nodes: int = 3) -> SlurmCluster:
        cluster = cls(root=root, suffix=uuid.uuid4().hex[:6])
        try:
            cluster._build(n_nodes)
        except BaseException:
            cluster.destroy()
            raise
        return cluster

    # --- building ------------------------------------------------------------------------------
    def _build(self, n_nodes: int) -> None:
        ip("netns", "add", self.switch)
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        self._plug(self.controller, "vc", CONTROLLER_IP)
        for i in range(1, n_nodes + 1):
            node = Node(f"n{i}", f"ers-{self.suffix}-n{i}", f"{SUBNET}.{10 + i}")
            self._plug(node.ns, f"v{i}", node.addr)
            (self.root / "spool" / node.name).mkdir(parents=True)
            self.nodes.append(node)
        (self.root / "state").mkdir()
        self._start_munge()
        (self.root / "slurm.conf").write_text(self._config())
        self._daemon(self.controller, ["slurmctld", "-D", "-i"], "slurmctld.out")
        for node in self.nodes:
            self._daemon(node.ns, ["slurmd", "-D", "-N", node.name], f"slurmd-{node.name}.out")
        self.wait_idle([n.name for n in self.nodes], START_TIMEOUT_S)

    def _plug(self, ns: str, switch_end: str, addr: str) -> None:
        ip("netns", "add", ns)
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", switch_end,
           "netns", self.switch)
        ip("-n", self.switch, "link", "set", switch_end, "master", "br0")
        ip("-n", self.switch, "link", "set", switch_end, "up")
        ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")

    def _start_munge(self) -> None:
        """One munged for the whole cluster: its socket is a file, and every namespace
        shares this machine's file system."""
        key = self.root / "munge.key"
        subprocess.run(["mungekey", "-c", "-f", "-k", str(key)], check=True,
                       capture_output=True)
        key.chmod(0o600)
        self._daemon(None, ["munged", "-F", "-f", f"--socket={self.munge_socket}",
                            f"--key-file={key}", f"--pid-file={self.root / 'munged.pid'}",
                            f"--log-file={self.root / 'munged.log'}",
                            f"--seed-file={self.root / 'munge.seed'}"], "munged.out")
        deadline = time.monotonic() + 10.0
        while not self.munge_socket.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {self._tail('munged.out')}")
            time.sleep(0.05)

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge.sock"

    def _config(self) -> str:
        # The controller is named after this machine: slurmctld checks its host name.
        r = self.root
        lines = [
            f"ClusterName=er{self.suffix}",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}({CONTROLLER_IP})",
            "SlurmUser=root", "SlurmdUser=root",
            f"SlurmctldPort={_free_port_pair()}", "SlurmdPort=6818",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool' / '%n'}",
            f"SlurmdPidFile={r / 'slurmd.%n.pid'}", f"SlurmdLogFile={r / 'slurmd.%n.log'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}", f"SlurmctldLogFile={r / 'slurmctld.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin", "ReturnToService=2", "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "MailProg=/bin/true",
            "SlurmdTimeout=30", "SlurmctldTimeout=30", "InactiveLimit=0", "KillWait=5",
            "MessageTimeout=10",
        ]
        lines += [f"NodeName={n.name} NodeAddr={n.addr} CPUs=2 State=UNKNOWN"
                  for n in self.nodes]
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
                     "OverSubscribe=FORCE:4")
        return "\n".join(lines) + "\n"

    def _daemon(self, ns: str | None, argv: list[str], log_name: str) -> None:
        with open(self.root / log_name, "ab") as log:
            self.daemons.append(subprocess.Popen(
                self.nsenter(ns) + argv, env=self.env(), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    # --- using it ---------------------------------------------------------------------------------
    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        return {**env, "SLURM_CONF": str(self.root / "slurm.conf"), **(extra or {})}

    @staticmethod
    def nsenter(ns: str | None) -> list[str]:
        return ["nsenter", f"--net=/var/run/netns/{ns}"] if ns else []

    def run(self, argv: Sequence[str], ns: str | None = None, timeout: float = 30.0,
            check: bool = True, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        """A client command, on the controller (the submit host) unless `ns` says; `env`
        adds to its environment (sbatch passes it on to the job)."""
        done = subprocess.run(self.nsenter(ns or self.controller) + list(argv),
                              env=self.env(env), capture_output=True, text=True,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout}")
        return done

    def node_states(self) -> dict[str, str]:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"]).stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def wait_idle(self, names: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            try:
                states = self.node_states()
            except (RuntimeError, subprocess.TimeoutExpired):
                states = {}
            if all(states.get(name) == "idle" for name in names):
                return
            for daemon in self.daemons:
                if daemon.poll() is not None:
                    raise RuntimeError(f"{daemon.args} exited: {self._tail('slurmctld.log')}")
            time.sleep(0.2)
        raise RuntimeError(f"nodes not idle within {timeout:g}s: {states}; "
                           f"{self._tail('slurmctld.log')}")

    def drain(self, node: str) -> None:
        self.run(["scontrol", "update", f"nodename={node}", "state=drain", "reason=test"])

    def resume(self, node: str) -> None:
        self.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)

    def queue(self) -> list[str]:
        return self.run(["squeue", "-h", "-o", "%i %T"]).stdout.split("\n")[:-1]

    def _tail(self, name: str, lines: int = 15) -> str:
        try:
            return " | ".join((self.root / name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # --- tearing down -----------------------------------------------------------------------------
    def namespaces(self) -> list[str]:
        return [n.ns for n in self.nodes] + [self.controller, self.switch]

    def strays(self) -> dict[int, str]:
        """Live processes in the cluster's namespaces other than its daemons."""
        daemons = set()
        for daemon in self.daemons:
            daemons.add(daemon.pid)
            daemons.update(_children(daemon.pid))
        found = pids_in_namespaces(self.namespaces())
        return {pid: f"{ns}: {cmdline(pid)}" for pid, ns in found.items()
                if pid not in daemons and not is_zombie(pid)}

    def destroy(self) -> None:
        """Cancels every job, stops every daemon, kills whatever is left in the namespaces
        and deletes them. Safe after a partial build."""
        if any(d.poll() is None for d in self.daemons):
            self.run(["scancel", "--full", "--state=RUNNING"], check=False, timeout=10)
            self.run(["scancel", "--state=PENDING"], check=False, timeout=10)
        for daemon in reversed(self.daemons):
            if daemon.poll() is None:
                os.killpg(daemon.pid, signal.SIGTERM)
        for daemon in self.daemons:
            try:
                daemon.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait(5)
        for pid in pids_in_namespaces(self.namespaces()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        existing = ip("netns", "list", check=False).stdout
        for ns in self.namespaces():
            if ns in existing:
                ip("netns", "del", ns, check=False)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _free_port_pair() -> int:
    """A port for slurmctld (in its own namespace, so any is free; varied to be safe)."""
    return 6900 + int(uuid.uuid4().hex[:2], 16)
