"""Launchers side by side: the same job through each, in the same run.

local   two "hosts" on this machine (localhost and 127.0.0.1): subprocesses of the driver
ssh     two hosts in network namespaces with a real sshd each (tests/ssh/netns.py)
agent   the same hosts without sshd, an `elasticrun agent` in each connecting out
(slurm launchers: benchmarks/slurm_launch.py, on a Slurm cluster)

A trial: the job trains on host A (2 workers, ~1M parameters, a commit every step); host B
(2 slots) appears (discovery lists it; for agents, its agent starts). Measured:
- launch: B appears -> B's worker processes have started (the launcher's own latency:
  discovery's notice and the spawn, or the agent's start and connect, and the launcher
  starting the processes);
- grow: B appears -> the first completed step at world size 4 (launch, the new workers'
  interpreter and torch import, the rendezvous, the state sync);
- resume: one of B's workers is SIGKILLed -> the first completed step after recovery
  (the 3 survivors go on in-process; the dead worker's slot gets a new worker).
The namespaces need root; without it, `local` and agents on loopback run. --quick: agents
on loopback, a tiny model.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib import (
    PYTHON,
    REPO,
    SCRIPTS,
    Jobs,
    bench_env,
    elasticrun_command,
    free_port,
    print_table,
    read_events,
    summarize,
    tagged_pids,
)

TOKEN = "launcher-benchmark-token-0123456789"
STEPS_BEFORE = 8  # steps at 2 workers before host B appears
STEPS_AT_4 = 5  # steps at 4 workers before the kill
DISCOVERY_INTERVAL_S = 0.5
PHASES = ("launch_s", "grow_s", "resume_s")


@dataclass
class Setup:
    """How one launcher runs the job: the driver's command, and how host B appears."""

    name: str
    host_a: str
    host_b: str
    driver: Callable[[list[str]], list[str]]  # elasticrun args -> the driver's argv
    args: list[str]
    appear: Callable[[Jobs, dict[str, str]], None] = lambda jobs, env: None
    before: Callable[[Jobs, dict[str, str]], None] = lambda jobs, env: None
    notes: dict[str, str] = field(default_factory=dict)


def _hosts_script(tmp: Path, first: str) -> tuple[Path, Path]:
    hosts, script = tmp / "hosts", tmp / "hosts.sh"
    hosts.write_text(f"{first}:2\n")
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    return hosts, script


def _add_host(hosts: Path, host: str) -> Callable[[Jobs, dict[str, str]], None]:
    def appear(_jobs: Jobs, _env: dict[str, str]) -> None:
        staged = hosts.with_suffix(".new")
        staged.write_text(hosts.read_text() + f"{host}:2\n")
        os.replace(staged, hosts)
    return appear


def local_setup(tmp: Path) -> Setup:
    hosts, script = _hosts_script(tmp, "localhost")
    return Setup("local", "localhost", "127.0.0.1", lambda args: args,
                 ["--host-discovery-script", str(script)], appear=_add_host(hosts, "127.0.0.1"))


def _in_ns(ns: str | None, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv] if ns else argv


def agent_setup(tmp: Path, cluster: Any = None) -> Setup:
    """Agents in the cluster's namespaces (or, without one, on loopback as hosts a, b)."""
    token = tmp / "token"
    token.write_text(TOKEN)
    port = free_port()
    hosts = [cluster.hosts[0], cluster.hosts[1]] if cluster else []
    names = [h.addr for h in hosts] or ["a", "b"]
    driver_ip = "10.77.0.2" if cluster else "127.0.0.1"

    def agent(jobs: Jobs, env: dict[str, str], index: int) -> None:
        jobs.start(_in_ns(hosts[index].ns if hosts else None, [
            PYTHON, "-m", "elasticrun", "agent", "--driver", f"http://{driver_ip}:{port}",
            "--token-file", str(token), "--host", names[index], "--slots", "2"]), env)

    extra = ["--network-interface", "eth0"] if cluster else []
    return Setup("agent", names[0], names[1],
                 lambda args: _in_ns(cluster.launcher if cluster else None, args),
                 ["--launcher", "agent", "--port", str(port), "--agent-token-file", str(token),
                  *extra], appear=lambda jobs, env: agent(jobs, env, 1),
                 before=lambda jobs, env: agent(jobs, env, 0))


def ssh_setup(tmp: Path, cluster: Any) -> Setup:
    a, b = cluster.hosts[0].addr, cluster.hosts[1].addr
    hosts, script = _hosts_script(tmp, a)
    return Setup("ssh", a, b, lambda args: _in_ns(cluster.launcher, args),
                 ["--launcher", "ssh", "--ssh-identity-file", str(cluster.client_key),
                  "--host-discovery-script", str(script), "--network-interface", "eth0"],
                 appear=_add_host(hosts, b), notes={"HOME": str(cluster.home)})


def _worker_pids(jobs: Jobs, host: str, out: Path) -> list[int]:
    """The live workers of `host`, by their events (a worker forked from a template shows
    the template's environment in /proc, not its own)."""
    logged = {e["pid"] for e in read_events(out) if e.get("host") == host}
    return [pid for pid in tagged_pids(jobs.tag) if pid in logged]


def _wait(out: Path, jobs: Jobs, what: str, check: Callable[[list[dict[str, Any]]], bool],
          timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not check(read_events(out)):
        if time.monotonic() > deadline or any(p.poll() is not None for p in jobs.procs):
            raise RuntimeError(f"the job stopped or never reached {what}")
        time.sleep(0.05)


def trial(setup: Setup, params: float, tmp: Path) -> dict[str, float]:
    out = tmp / "events.jsonl"
    env = bench_env({"BENCH_OUT": str(out), "BENCH_PARAMS": f"{params:g}",
                     "BENCH_STEPS": "100000", "BENCH_COMMIT_EVERY": "1", **setup.notes})
    args = ["-np", "2", "--min-np", "2", "--max-np", "4", "--discovery-interval",
            str(DISCOVERY_INTERVAL_S), *setup.args]
    with Jobs() as jobs:
        setup.before(jobs, env)
        jobs.start(setup.driver(elasticrun_command(args, SCRIPTS / "er_train.py")), env)
        _wait(out, jobs, "training", lambda ev: _steps(ev, 2) >= STEPS_BEFORE)
        appeared = time.time()
        setup.appear(jobs, env)
        _wait(out, jobs, "world size 4", lambda ev: _steps(ev, 4) >= STEPS_AT_4)
        victims = _worker_pids(jobs, setup.host_b, out)
        if not victims:
            raise RuntimeError(f"no worker of host {setup.host_b} found")
        killed = time.time()
        os.kill(victims[0], signal.SIGKILL)
        _wait(out, jobs, "the resume", lambda ev: _resumed(ev, killed) is not None)
    events = read_events(out)
    started = min(e["at"] for e in events if e["event"] == "started" and e["at"] > appeared)
    grown = min(e["time"] for e in events if e["event"] == "step" and e["size"] == 4)
    resumed = _resumed(events, killed)
    assert resumed is not None
    return {"launch_s": started - appeared, "grow_s": grown - appeared,
            "resume_s": resumed - killed}


def _resumed(events: list[dict[str, Any]], killed: float) -> float | None:
    """The first step of the round after the kill: after a survivor's "reset" (the step in
    flight at the kill may still complete: the victim had sent its part). The round is the 3
    survivors', or 4 when the slot's new worker was ready before it formed."""
    resets = [e["time"] for e in events if e["event"] == "reset" and e["time"] > killed]
    if not resets:
        return None
    return min((e["time"] for e in events if e["event"] == "step" and e["time"] > min(resets)),
               default=None)


def _steps(events: list[dict[str, Any]], size: int) -> int:
    return sum(e["event"] == "step" and e["size"] == size and e["rank"] == 0 for e in events)


@contextmanager
def _clusters(quick: bool) -> Iterator[tuple[Any, Any]]:
    """(a namespace cluster with sshd, one without) when root can build them, else (None,
    None)."""
    if quick or os.geteuid() != 0:
        yield None, None
        return
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from tests.ssh.netns import Cluster, unavailable  # the test suite's virtual hosts

    if unavailable() is not None:
        yield None, None
        return
    with tempfile.TemporaryDirectory() as root:
        with_sshd = Cluster.create(Path(root), n_hosts=2)
        try:
            yield with_sshd, with_sshd  # agents run fine beside an idle sshd
        finally:
            with_sshd.destroy()


def bench(trials: int, quick: bool) -> dict[str, Any]:
    params = 1e5 if quick else 1e6
    runs: dict[str, list[dict[str, float]]] = {}
    with _clusters(quick) as (ssh_cluster, agent_cluster):
        # --quick: the agents alone (the local launcher's path is the other smoke tests')
        makers: dict[str, Callable[[Path], Setup]] = {} if quick else {"local": local_setup}
        if ssh_cluster is not None:
            makers["ssh"] = lambda tmp: ssh_setup(tmp, ssh_cluster)
        makers["agent"] = lambda tmp: agent_setup(tmp, agent_cluster)
        for _ in range(trials):  # interleaved, so that drift of the machine hits all
            for name, make in makers.items():
                with tempfile.TemporaryDirectory() as tmp:
                    runs.setdefault(name, []).append(trial(make(Path(tmp)), params, Path(tmp)))
    medians = {name: summarize(trials_) for name, trials_ in runs.items()}
    where = "loopback" if quick or agent_cluster is None else "hosts in network namespaces"
    print_table(f"launchers: host added -> first step at 4 workers, kill -> first step after; "
                f"~{params / 1e6:g}M parameters, {where}; median of {trials} (s)",
                ["launcher", *PHASES], [[name, *(m[p] for p in PHASES)]
                                        for name, m in medians.items()])
    return {"median": medians, "trials": runs, "where": where}
