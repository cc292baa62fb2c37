"""This process's place in the job: the driver client, who it is, and its sequence of rounds.

`init()` asks the driver for this worker's slot and builds the round's `RoundSession`;
`reset()` leaves the round and joins the next one. The `Runtime` owns what outlives a
round (the driver client, the worker id, the timeouts, the notice watcher, the timing of
the last join); everything a round builds belongs to its session. Without elasticrun's
environment, `init()` makes a world of one process.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist

from elasticrun import protocol
from elasticrun.job.errors import ConfigError
from elasticrun.protocol import SlotInfo
from elasticrun.system.netif import interface_towards
from elasticrun.torch.world import devices
from elasticrun.torch.world.devices import DataPlane
from elasticrun.torch.world.driver_calls import DriverCalls
from elasticrun.torch.world.groups import group_count as _group_count  # noqa: F401 - tests use it
from elasticrun.torch.world.groups import init_process_group as _init_process_group
from elasticrun.torch.world.joining import JoinTiming, join_next_round
from elasticrun.torch.world.replicas import shard_size_from_env
from elasticrun.torch.world.session import RoundSession
from elasticrun.worker import foothold, pace, timeline
from elasticrun.worker.client import DriverClient
from elasticrun.worker.liveness import StallWatch, watch_stalls
from elasticrun.worker.notices import NoticeWatcher, stop_for_good
from elasticrun.worker.pace import PaceMeter, PaceReporter

log = logging.getLogger("elasticrun.worker")

_NO_SLOT = SlotInfo("", 0, 1, 0, 1, 0, 1)


def _connect(slot: SlotInfo, store: dist.Store, timeout: float) -> None:
    # Looked up at each build, so that tests can replace `_init_process_group` (to crash a
    # worker between joining a round and building its group).
    _init_process_group(slot, store, timeout)


class Runtime(DriverCalls):
    """The driver client, this worker's identity and timeouts, the notice watcher, and the
    current round's session (`session`; None before the first join). Its calls to the
    driver outside a join are `DriverCalls`'."""

    def __init__(
        self,
        client: DriverClient | None = None,
        worker_id: str = "",
        collective_timeout: float = 60.0,
        round_timeout: float = 600.0,
        driver_peer: tuple[str, int] = ("", 0),
        shard_size: int = 1,
    ) -> None:
        self.client = client
        self.worker_id = worker_id
        self.collective_timeout = collective_timeout
        self.round_timeout = round_timeout
        self.driver_peer = driver_peer
        self.session: RoundSession | None = None
        self.left_round = 0  # the round this worker left at shutdown() (init() joins the next)
        self.notices: NoticeWatcher | None = None
        self.last_join = JoinTiming()
        self.plane = DataPlane()
        self.stall_watch: StallWatch | None = None  # hang detection: launched workers only
        self.pace: PaceReporter | None = None  # the pace reports (stragglers): the same
        self.shard_size = shard_size  # --shard-size: replica groups of this many ranks
        # Called after every round this worker joins (what outlives a round, rebound to it).
        self.on_round: list[Callable[[], None]] = []

    @classmethod
    def from_env(cls) -> Runtime:
        env = os.environ
        return cls(
            client=DriverClient.from_env(),
            worker_id=env[protocol.ENV_WORKER_ID],
            collective_timeout=float(env.get(protocol.ENV_COLLECTIVE_TIMEOUT, "60")),
            round_timeout=float(env.get(protocol.ENV_ROUND_TIMEOUT, "600")),
            driver_peer=_resolve(env[protocol.ENV_RENDEZVOUS_ADDR],
                                 int(env[protocol.ENV_RENDEZVOUS_PORT])),
            shard_size=shard_size_from_env(),
        )

    @property
    def launched(self) -> bool:
        return self.client is not None

    @property
    def round(self) -> int:
        return self.session.number if self.session is not None else 0

    @property
    def slot(self) -> SlotInfo:
        return self.session.slot if self.session is not None else _NO_SLOT

    @property
    def notice_seq(self) -> int:
        return self.session.notice_seq if self.session is not None else 0

    @property
    def device(self) -> torch.device | None:
        """The GPU this worker is pinned to (None: not pinned, or no GPU)."""
        return self.plane.device

    @property
    def store(self) -> dist.Store | None:
        return self.session.store if self.session is not None else None

    def start(self) -> None:
        """Joins the first round (blocks until it is complete), or makes a world of one."""
        local_rank = int(os.environ.get(protocol.ENV_LOCAL_RANK, "0"))
        self.plane, overridden = devices.configure(local_rank)
        for setting in overridden:
            log.warning("%s is set: a failed peer may take this process down instead of "
                        "letting it recover in-process", setting)
        if not self.launched:
            self._build_alone(0)
            timeline.attach(None, "", self._lane)
            return
        assert self.client is not None
        timeline.attach(self.client, self.worker_id, self._lane)
        if "GLOO_SOCKET_IFNAME" not in os.environ:
            interface = interface_towards(*self.driver_peer)
            if interface:  # the interface that reaches the driver reaches the peers too
                os.environ["GLOO_SOCKET_IFNAME"] = interface
        meter = PaceMeter() if pace.measuring() else None
        self.stall_watch = watch = watch_stalls(
            self.client, self.worker_id, lambda *probe: notices.probed(*probe), meter)
        if meter is not None:
            self.pace = PaceReporter(meter, self.client, self.worker_id, lambda: self.round)
            self.pace.start()
        self.notices = notices = NoticeWatcher(
            self.client, lambda: self.round, self._round_broken,
            lambda reason: stop_for_good(self.slot.rank, reason), self.worker_id,
            watch.clock.snapshot if watch is not None else None)
        self.notices.start()  # before the first join: a build whose round broke is aborted
        self._join(last_round=0, failure="", committed=False)

    def _build_alone(self, number: int) -> None:
        """A world of one (no driver): its round `number`, on a store of its own."""
        self.session = RoundSession(number, SlotInfo("localhost", 0, 1, 0, 1, 0, 1),
                                    dist.HashStore(), collective_timeout=self.collective_timeout)
        self.session.build(_connect)

    def leave(self) -> None:
        """Horovod's shutdown(): leaves the round (its group torn down), staying in the job;
        `rejoin()` joins the round after it (init() after shutdown())."""
        if self.session is not None:
            self.left_round = self.session.number
            self.session.leave(last=True)
            self.session = None

    def rejoin(self) -> None:
        """Joins the round after the one this worker left: every worker that re-initialises
        asks for it, and the driver opens it with them, on fresh store keys and a new group."""
        if not self.launched:
            self._build_alone(self.left_round + 1)
            return
        self._join(self.left_round, failure="", committed=False)

    def reset(self, failure: str = "", committed: bool = False) -> None:
        """Leaves the current round and joins the next one. `failure` (why this worker left:
        "" for a host change) and `committed` (whether it completed a commit in the round)
        go to the driver with the join request."""
        if not self.launched:
            return
        last_round = self.round
        if self.session is not None:
            with timeline.span("leave", "round", round=last_round):
                self.session.leave()
        self._join(last_round, failure, committed)

    def close(self) -> None:
        """Leaves the job for good (at interpreter exit)."""
        self.leave()
        if self.pace is not None:
            self.pace.stop()
        timeline.detach()  # the last events, before the client closes (bounded)
        if self.client is not None:
            self.client.close()

    def hosts_changed(self) -> bool:
        """True when the driver announced a host change the current round does not reflect."""
        return self.notices is not None and self.notices.latest > self.notice_seq

    def pending_notices(self) -> list[protocol.Notice]:
        """The host-change notices the current round does not reflect (the next commit
        raises HostsUpdatedInterrupt for them)."""
        return [] if self.notices is None else self.notices.notices_after(self.notice_seq)

    def _join(self, last_round: int, failure: str, committed: bool) -> None:
        self.last_join = join_next_round(self, _connect, last_round, failure, committed)
        for listener in self.on_round:
            listener()

    def _lane(self) -> tuple[int, str]:
        """This worker's rank (-1 before its first round) and host, for its timeline lane."""
        if self.session is None:
            return -1, os.environ.get(protocol.ENV_HOSTNAME, "")
        return self.slot.rank, self.slot.hostname

    def _round_broken(self, broken_round: int) -> None:
        """Called by the watcher thread: the driver says a member of a round failed."""
        session = self.session
        if session is not None and session.number == broken_round:
            count = session.abort()
            log.debug("round %d broke; severed %d connection(s)", broken_round, count)


_runtime: Runtime | None = None
_parked: Runtime | None = None  # shut down, in the job still: init() joins it to a new round


def init() -> None:
    """Joins the job (idempotent). Blocks until this worker's round is complete. After
    shutdown(), joins the round after the one it left (Horovod's init -> shutdown -> init)."""
    global _runtime, _parked
    if _runtime is not None:
        return
    if _parked is not None:
        runtime, _parked = _parked, None
        runtime.rejoin()
        _runtime = runtime
        return
    # Tear the group down before interpreter exit: torch 2.13's Gloo threads can abort
    # the process when the group is only destroyed during interpreter finalisation.
    atexit.register(_close)
    runtime = Runtime.from_env() if protocol.ENV_RENDEZVOUS_ADDR in os.environ else Runtime()
    foothold.retire()  # this worker's own collectives report its stalls from now on
    try:
        runtime.start()
    except ConfigError as exc:  # e.g. --backend nccl without a GPU: one line, no traceback
        print(f"elasticrun: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    _runtime = runtime


def reset(failure: str = "", committed: bool = False) -> None:
    """Leaves the current round and joins the next one (a new process group)."""
    current().reset(failure, committed)


def shutdown() -> None:
    """Leaves the round (Horovod's shutdown): is_initialized() is False until init()."""
    global _runtime, _parked
    if _runtime is None:
        return
    runtime, _runtime = _runtime, None
    runtime.leave()
    _parked = runtime


def _close() -> None:
    """At interpreter exit: leaves the job for good."""
    global _parked
    shutdown()
    runtime, _parked = _parked, None
    if runtime is not None:
        runtime.close()


def current() -> Runtime:
    if _runtime is None:
        raise RuntimeError("elasticrun is not initialised: call elasticrun.torch.init() first")
    return _runtime


def is_initialized() -> bool:
    """Whether init() has run in this process (and shutdown() has not since)."""
    return _runtime is not None


def _resolve(host: str, port: int) -> tuple[str, int]:
    try:
        return socket.gethostbyname(host), port
    except OSError:
        return host, port

