"""torchrun's multi-node form on real separate hosts (network namespaces on one bridge,
tests/ssh/netns.py): the same `elasticrun --nnodes 2:3 --nproc-per-node 1 --rdzv-endpoint
H1:PORT --rdzv-id ID --local-addr ADDR ddp_checkpoint.py ...` line on every node, as under
torchrun. H1 owns the endpoint: its elasticrun serves the job's driver and runs an agent
beside it; every other node's elasticrun is an agent that connects out to it.

An unmodified DDP script with its own checkpoint (tests/trainers/scripts/ddp_checkpoint.py)
grows from two nodes to three when a third node's elasticrun starts, and shrinks to two when
a non-hosting node's elasticrun is SIGKILLed: each change restarts the round (not counted,
TORCHELASTIC_RESTART_COUNT stays 0) and the script resumes from its checkpoint. A worker
SIGKILLed alone restarts the round, counted against --max-restarts; with none left, every
node's elasticrun fails. Nothing of the job is left on any node.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from tests.agents.harness import kill_job
from tests.integration.harness import (
    PYTHON,
    REPO,
    assert_no_orphans,
    free_port,
    is_zombie,
    job_env,
    tagged_pids,
)
from tests.ssh.netns import Cluster, cmdline, kill_all, netns_inode, unavailable

pytestmark = pytest.mark.timeout(120)

H1, H2, H3 = "10.77.0.11", "10.77.0.12", "10.77.0.13"
SCRIPT = REPO / "tests" / "trainers" / "scripts" / "ddp_checkpoint.py"
SAVE_EVERY = 5
STEP_SLEEP = 0.1
# Worker lines on the hosting node's console, stamped by --prefix-output-with-timestamp and
# prefixed with their rank (--tee 1, torchrun's prefix made elasticrun's own: RANKED_LINES).
RANKED_LINES = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${rank}]<stdout>:"}
WORKER_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT[\d:.]+) \[(\d+)\]<stdout>:(.*)$", re.MULTILINE)
STEP = re.compile(r"step (\d+) rank (\d+) restart (\d+)")
START = re.compile(r"start resumed_from=(\d+) world=(\d+)")
DONE = re.compile(r"done steps=(\d+) world=(\d+)")


# --- the cluster ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = unavailable(sshd=False)
    if reason is not None:
        pytest.skip(f"nodes on separate hosts need network namespaces: {reason}")
    built = Cluster.create(tmp_path_factory.mktemp("torchrun-nodes"), n_hosts=3, sshd=False)
    try:
        yield built
    finally:
        built.destroy()


@pytest.fixture
def jobs(cluster: Cluster) -> Iterator[list[NodesJob]]:
    """Every job a test starts: whatever is left of it is killed at the test's end, and
    nothing may be left in the cluster's namespaces."""
    started: list[NodesJob] = []
    yield started
    for job in started:
        kill_job(list(job.nodes.values()), job.tag)
    left = cluster.wait_for_no_strays(within=15.0)
    kill_all(list(left))
    assert not left, f"processes left in the cluster's namespaces: {left}"


# --- reading the workers' output ------------------------------------------------------------
@dataclass(frozen=True)
class Line:
    at: float  # wall clock, from the line's timestamp prefix
    rank: int
    text: str


@dataclass(frozen=True)
class Step:
    at: float
    step: int
    rank: int
    restart: int


@dataclass
class Round:
    """One round's run of the script, from its rank 0's `start` line on."""

    at: float
    resumed_from: int
    world: int
    steps: list[Step] = field(default_factory=list)

    @property
    def first_step_at(self) -> float:
        return min(s.at for s in self.steps)

    def reached(self, step: int) -> bool:
        return any(s.step >= step and s.rank == 0 for s in self.steps)


def worker_lines(text: str) -> list[Line]:
    return [Line(datetime.fromisoformat(at).timestamp(), int(rank), line)
            for at, rank, line in WORKER_LINE.findall(text)]


def rounds_of(text: str) -> list[Round]:
    """The script's runs, in order: each step line belongs to the last round started before
    its timestamp (a rank's step line may be forwarded before rank 0's start line)."""
    lines = worker_lines(text)
    found = [Round(line.at, int(m[1]), int(m[2])) for line in lines
             if line.rank == 0 and (m := START.fullmatch(line.text))]
    for line in lines:
        if (m := STEP.fullmatch(line.text)) and found:
            owner = [r for r in found if r.at <= line.at] or found[:1]
            owner[-1].steps.append(Step(line.at, int(m[1]), int(m[2]), int(m[3])))
    return found


# --- one job on several nodes ---------------------------------------------------------------
class NodesJob:
    """One torchrun-form job: the same elasticrun line started on each node, in the node's
    namespace; each node's console (stdout and stderr) goes to a file. Every node's process
    carries the job's test tag, and so does all it starts."""

    def __init__(self, cluster: Cluster, tmp: Path, steps: int, extra: Sequence[str] = ()
                 ) -> None:
        self.cluster = cluster
        self.tmp = tmp
        self.port = free_port()
        self.rdzv_id = f"nodes-{uuid.uuid4().hex[:8]}"
        self.env, self.tag = job_env(RANKED_LINES)
        self.line = [
            "--nnodes", "2:3", "--nproc-per-node", "1",
            "--rdzv-endpoint", f"{H1}:{self.port}", "--rdzv-id", self.rdzv_id,
            "--rdzv-conf", "last_call_timeout=1", "--tee", "1", "--log-dir", str(tmp / "logs"),
            "--prefix-output-with-timestamp", *extra,
            str(SCRIPT), "--steps", str(steps), "--save-every", str(SAVE_EVERY),
            "--out", str(tmp / "checkpoints"), "--step-sleep", str(STEP_SLEEP)]
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, addr: str) -> subprocess.Popen[bytes]:
        host = self.cluster.host(addr)
        with open(self.console_file(addr), "ab") as console:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", host.ns, PYTHON, "-m", "elasticrun",
                 "--local-addr", addr, *self.line],
                env=self.env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=console,
                stderr=subprocess.STDOUT)
        self.nodes[addr] = proc
        return proc

    def console_file(self, addr: str) -> Path:
        return self.tmp / f"node-{addr}.log"

    def console(self, addr: str = H1) -> str:
        try:
            return self.console_file(addr).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def rounds(self) -> list[Round]:
        return rounds_of(self.console(H1))

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float = 60.0) -> float:
        """Polls `check` until it holds; returns the wall time it was first seen to."""
        deadline = time.monotonic() + timeout
        while not check():
            ended = {a: p.returncode for a, p in self.nodes.items() if p.poll() is not None}
            if H1 in ended or time.monotonic() > deadline:
                why = f"the job ended ({ended})" if H1 in ended else f"timed out ({timeout:g}s)"
                raise AssertionError(f"{why} waiting for {what}:\n{self.console()[-5000:]}")
            time.sleep(0.05)
        return time.time()

    def round_at(self, index: int, world: int) -> Callable[[], Round | None]:
        def find() -> Round | None:
            rounds = self.rounds()
            if len(rounds) > index and rounds[index].world == world:
                return rounds[index]
            return None
        return find

    def train_past_a_checkpoint(self, index: int, world: int) -> Round:
        """Waits until round `index` (of `world` workers) saved a checkpoint of its own."""
        find = self.round_at(index, world)
        self.wait_for(f"round {index + 1} at world {world}", lambda: find() is not None)
        started = find()
        assert started is not None
        goal = (started.resumed_from // SAVE_EVERY + 1) * SAVE_EVERY + 1
        self.wait_for(f"step {goal} in round {index + 1}",
                      lambda: (r := find()) is not None and r.reached(goal))
        trained = find()
        assert trained is not None
        return trained

    def finish(self, addr: str, timeout: float = 60.0) -> int:
        try:
            return self.nodes[addr].wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"node {addr}'s elasticrun did not exit within {timeout:g}s:"
                                 f"\n{self.console(addr)[-3000:]}") from None

    def close(self) -> None:
        """Every node's process has exited; nothing of the job is left anywhere."""
        for addr, proc in self.nodes.items():
            assert proc.poll() is not None, f"node {addr}'s elasticrun is still running"
        assert_no_orphans(self.tag, within=10.0)
        left = self.cluster.wait_for_no_strays(within=10.0)
        assert not left, f"left in the nodes' namespaces: {left}"


def workers_in(ns: str, tag: str) -> list[int]:
    """The job's workers in network namespace `ns`: the processes a worker template forked
    (a forked worker's /proc shows the template's command line, so its parent tells)."""
    net = netns_inode(ns)
    found = []
    for pid in tagged_pids(tag):
        try:
            in_node = os.stat(f"/proc/{pid}/ns/net").st_ino == net
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if in_node and not is_zombie(pid) and "elasticrun.worker.template" in cmdline(parent):
            found.append(pid)
    return found


def ranks_in_round(console: str, number: int) -> dict[str, int]:
    """host -> rank in round `number`, from the driver's `round N: world size W on
    HOST:SLOTS,...` line (hosts in rank order, one slot each)."""
    found = re.search(rf"^elasticrun: round {number}: world size \d+ on (\S+)", console,
                      re.MULTILINE)
    assert found, f"no round {number} in:\n{console[-3000:]}"
    return {entry.split(":")[0]: rank for rank, entry in enumerate(found[1].split(","))}


def restart_counts(rounds: Sequence[Round]) -> list[set[int]]:
    return [{s.restart for s in r.steps} for r in rounds]


def report(name: str, **seconds: float) -> None:
    """Timings, for the record (pytest -s shows them)."""
    print(f"\n{name}: " + ", ".join(f"{k} {v:.1f}s" for k, v in seconds.items()))


# --- the tests ------------------------------------------------------------------------------
def test_a_node_joins_and_a_node_is_killed_each_restarts_the_round_uncounted(
        cluster: Cluster, tmp_path: Path, jobs: list[NodesJob]) -> None:
    began = time.time()
    # Training goes on while the third node's elasticrun starts (seconds on a loaded
    # machine): enough steps that the job cannot end before the last change.
    job = NodesJob(cluster, tmp_path, steps=120)
    jobs.append(job)
    job.start(H1)
    job.start(H2)
    job.train_past_a_checkpoint(0, world=2)
    job.start(H3)
    joined = job.wait_for(f"{H3} joined", lambda: f"agent joined: host {H3}" in job.console())
    grown = job.train_past_a_checkpoint(1, world=3)
    os.kill(job.nodes[H2].pid, signal.SIGKILL)  # `ip netns exec` execs: elasticrun itself
    killed = time.time()
    assert job.finish(H1) == 0, job.console()[-5000:]
    assert job.finish(H3) == 0, job.console(H3)[-3000:]
    assert job.finish(H2) == -signal.SIGKILL
    rounds = job.rounds()
    text = job.console()
    assert [r.world for r in rounds] == [2, 3, 2], text[-5000:]
    assert rounds[0].resumed_from == 0
    assert 0 < rounds[1].resumed_from < rounds[2].resumed_from
    assert restart_counts(rounds) == [{0}, {0}, {0}], "a membership change was counted"
    assert [{s.rank for s in r.steps} for r in rounds] == [{0, 1}, {0, 1, 2}, {0, 1}]
    assert [set(ranks_in_round(text, n)) for n in (1, 2, 3)] == [
        {H1, H2}, {H1, H2, H3}, {H1, H3}]
    assert [m.groups() for m in DONE.finditer(text)] == [("120", "2")]
    assert "elasticrun: error" not in text
    job.close()
    report("join and loss", join_to_first_step=grown.first_step_at - joined,
           loss_to_first_step=rounds[2].first_step_at - killed, total=time.time() - began)


def test_a_killed_worker_restarts_the_round_counted_on_the_same_nodes(
        cluster: Cluster, tmp_path: Path, jobs: list[NodesJob]) -> None:
    began = time.time()
    job = NodesJob(cluster, tmp_path, steps=30, extra=["--max-restarts", "1"])
    jobs.append(job)
    job.start(H1)
    job.start(H2)
    job.train_past_a_checkpoint(0, world=2)
    [victim] = workers_in(cluster.host(H2).ns, job.tag)
    os.kill(victim, signal.SIGKILL)
    killed = time.time()
    restarted = job.train_past_a_checkpoint(1, world=2)
    assert job.finish(H1) == 0, job.console()[-5000:]
    assert job.finish(H2) == 0, job.console(H2)[-3000:]
    rounds = job.rounds()
    text = job.console()
    assert [r.world for r in rounds] == [2, 2], text[-5000:]
    assert restart_counts(rounds) == [{0}, {1}]
    assert ranks_in_round(text, 1) == ranks_in_round(text, 2)  # the same nodes, ranks
    assert rounds[1].resumed_from > 0
    assert "restart 1 of --max-restarts 1" in text
    assert [m.groups() for m in DONE.finditer(text)] == [("30", "2")]
    job.close()
    report("worker killed, --max-restarts 1",
           kill_to_first_step=restarted.first_step_at - killed, total=time.time() - began)


def test_a_killed_worker_with_no_restarts_left_fails_every_node(
        cluster: Cluster, tmp_path: Path, jobs: list[NodesJob]) -> None:
    began = time.time()
    job = NodesJob(cluster, tmp_path, steps=200)
    jobs.append(job)
    job.start(H1)
    job.start(H2)
    job.train_past_a_checkpoint(0, world=2)
    [victim] = workers_in(cluster.host(H2).ns, job.tag)
    os.kill(victim, signal.SIGKILL)
    killed = time.time()
    assert job.finish(H1) != 0
    ended = time.time()
    assert job.finish(H2) != 0, job.console(H2)[-3000:]
    text = job.console()
    errors = [line for line in text.splitlines() if line.startswith("elasticrun: error:")]
    assert len(errors) == 1, text[-5000:]
    rank = ranks_in_round(text, 1)[H2]
    assert f"rank {rank} on host {H2} was killed by SIGKILL" in errors[0], errors[0]
    assert "--max-restarts is 0" in errors[0], errors[0]
    assert len(job.rounds()) == 1 and not DONE.search(text)
    job.close()
    report("worker killed, --max-restarts 0", kill_to_failure=ended - killed,
           total=time.time() - began)


def test_a_frozen_node_is_found_in_seconds_and_the_others_go_on(
        cluster: Cluster, tmp_path: Path, jobs: list[NodesJob]) -> None:
    """Every process of a node SIGSTOPped (a frozen machine): nothing closes, its agent
    answers nothing. The others' footholds report their sleeping collectives, the driver
    probes, the node does not answer: its worker is hung, the node fails, and the round
    restarts on the other two (counted) long before the agent's heartbeats would tell."""
    began = time.time()
    job = NodesJob(cluster, tmp_path, steps=150, extra=["--max-restarts", "1"])
    jobs.append(job)
    job.start(H1)
    job.start(H2)
    job.train_past_a_checkpoint(0, world=2)
    job.start(H3)
    job.train_past_a_checkpoint(1, world=3)
    net = netns_inode(cluster.host(H3).ns)
    frozen = [pid for pid in tagged_pids(job.tag)
              if os.stat(f"/proc/{pid}/ns/net").st_ino == net and not is_zombie(pid)]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    stopped = time.time()
    restarted = job.train_past_a_checkpoint(2, world=2)
    assert job.finish(H1) == 0, job.console()[-5000:]
    assert job.finish(H2) == 0, job.console(H2)[-3000:]
    for pid in frozen:
        os.kill(pid, signal.SIGKILL)
    job.finish(H3)
    text = job.console()
    assert re.search(rf"rank \d on host {re.escape(H3)} hung: no heartbeat for [\d.]+s, and "
                     rf"its host does not answer", text), text[-5000:]
    assert restart_counts(job.rounds()) == [{0}, {0}, {1}]
    assert set(ranks_in_round(text, 3)) == {H1, H2}
    assert restarted.first_step_at - stopped < 30.0  # loose: a loaded machine
    assert [m.groups() for m in DONE.finditer(text)] == [("150", "2")]
    job.close()
    report("node frozen", stop_to_first_step=restarted.first_step_at - stopped,
           total=time.time() - began)
