"""This process's place in the job: the driver client, the current round, the process group.

`init()` asks the driver for this worker's slot and builds a Gloo process group through
the driver's store under the round's key prefix; `reset()` leaves the round and joins the
next one. Without elasticrun's environment, `init()` makes a world of one process.
"""

from __future__ import annotations

import atexit
import datetime
import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field

import torch.distributed as dist

from elasticrun import protocol
from elasticrun.netif import interface_towards
from elasticrun.protocol import SlotInfo
from elasticrun.worker.client import DriverClient, DriverUnreachableError, RequestRefusedError
from elasticrun.worker.notices import NoticeWatcher
from elasticrun.worker.sockets import new_tcp_sockets, open_socket_fds, sever
from elasticrun.worker.store import DriverStore

log = logging.getLogger("elasticrun.worker")


@dataclass
class JoinTiming:
    """Wall-clock times of this worker's last join (for benchmarks and debugging)."""

    asked: float = 0.0  # the join request was sent
    assigned: float = 0.0  # the driver answered with this worker's place in the round
    built: float = 0.0  # the round's process group is built


@dataclass
class Runtime:
    slot: SlotInfo
    round: int = 0
    notice_seq: int = 0
    client: DriverClient | None = None
    worker_id: str = ""
    collective_timeout: float = 60.0
    round_timeout: float = 600.0
    store: dist.Store | None = None  # kept alive: torch calls back into it
    notices: NoticeWatcher | None = None
    driver_peer: tuple[str, int] = ("", 0)
    round_sockets: dict[int, str] = field(default_factory=dict)
    last_join: JoinTiming = field(default_factory=JoinTiming)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def launched(self) -> bool:
        return self.client is not None


_runtime: Runtime | None = None


def init() -> None:
    """Joins the job (idempotent). Blocks until this worker's round is complete."""
    global _runtime
    if _runtime is not None:
        return
    # Tear the group down before interpreter exit: torch 2.13's Gloo threads can abort
    # the process when the group is only destroyed during interpreter finalisation.
    atexit.register(shutdown)
    env = os.environ
    if protocol.ENV_RENDEZVOUS_ADDR not in env:
        _runtime = Runtime(SlotInfo("localhost", 0, 1, 0, 1, 0, 1))
        _runtime.store = dist.HashStore()
        _init_process_group(_runtime)
        return
    client = DriverClient.from_env()
    runtime = Runtime(
        slot=SlotInfo("", 0, 1, 0, 1, 0, 1),
        client=client,
        worker_id=env[protocol.ENV_WORKER_ID],
        collective_timeout=float(env.get(protocol.ENV_COLLECTIVE_TIMEOUT, "60")),
        round_timeout=float(env.get(protocol.ENV_ROUND_TIMEOUT, "600")),
        driver_peer=_resolve(env[protocol.ENV_RENDEZVOUS_ADDR],
                             int(env[protocol.ENV_RENDEZVOUS_PORT])),
    )
    if "GLOO_SOCKET_IFNAME" not in env:
        interface = interface_towards(*runtime.driver_peer)
        if interface:  # the interface that reaches the driver reaches the peers too
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    runtime.notices = NoticeWatcher(
        client, lambda: runtime.round, lambda broken: _round_broken(runtime, broken),
        lambda reason: _driver_lost(runtime, reason))
    _join(runtime, last_round=0)
    runtime.notices.start()
    _runtime = runtime


def reset() -> None:
    """Leaves the current round and joins the next one (a new process group)."""
    runtime = current()
    if not runtime.launched:
        return
    _leave_round(runtime)
    _join(runtime, last_round=runtime.round)


def shutdown() -> None:
    global _runtime
    if _runtime is None:
        return
    _leave_round(_runtime)
    if _runtime.client is not None:
        _runtime.client.close()
    _runtime = None
    # Let the group's C++ side (and its threads) go now, not during interpreter teardown,
    # where torch 2.13's Gloo can abort the process ("terminate called ...").
    gc.collect()


def current() -> Runtime:
    if _runtime is None:
        raise RuntimeError("elasticrun is not initialised: call elasticrun.torch.init() first")
    return _runtime


def is_initialized() -> bool:
    return _runtime is not None


def report_synced() -> None:
    """Tells the driver that this worker holds its round's committed state, so that rank 0
    of a later round is always one that does."""
    runtime = current()
    if runtime.client is not None:
        try:
            runtime.client.call(protocol.PATH_SYNCED,
                                {"worker_id": runtime.worker_id, "round": runtime.round})
        except RequestRefusedError as exc:  # it is being stopped: nothing to hold for
            log.debug("the driver did not take the sync report: %s", exc)


def hosts_changed() -> bool:
    """True when the driver announced a host change that the current round does not reflect."""
    runtime = current()
    return runtime.notices is not None and runtime.notices.latest > runtime.notice_seq


_PEER_FAILURE_MARKERS = ("gloo", "connection reset", "connection closed", "broken pipe",
                         "timed out", "timeout")


def is_peer_failure(exc: BaseException) -> bool:
    """Whether `exc` says a peer (or its round) failed, rather than this worker's own code."""
    if isinstance(exc, DriverUnreachableError):
        return False  # the driver is gone: nothing to recover with
    message = str(exc).lower()
    return isinstance(exc, dist.DistError) or (
        isinstance(exc, RuntimeError) and any(m in message for m in _PEER_FAILURE_MARKERS))


def _join(runtime: Runtime, last_round: int) -> None:
    """Joins the next round and builds its group. If a peer fails while the group is being
    built (it died, hung, or the round broke), asks for the round after it instead."""
    assert runtime.client is not None
    give_up = time.monotonic() + runtime.round_timeout
    timing = JoinTiming(asked=time.time())
    while True:
        reply = protocol.JoinReply.from_json(runtime.client.call(
            protocol.PATH_JOIN,
            {"worker_id": runtime.worker_id, "last_round": last_round},
            wait=protocol.MAX_POLL_S,
        ))
        if reply.action == "exit":
            print(f"elasticrun: this worker leaves the job ({reply.reason})", file=sys.stderr)
            raise SystemExit(0)
        if reply.action == "run" and reply.slot is not None:
            timing.assigned = time.time()
            try:
                _build_group(runtime, reply)
                timing.built = time.time()
                runtime.last_join = timing
                return
            except Exception as exc:
                if not is_peer_failure(exc) or time.monotonic() > give_up:
                    raise
                log.warning("building round %d's group failed (%s); asking for a new round",
                            reply.round, str(exc).splitlines()[0][:200] if str(exc) else exc)
                _leave_round(runtime)
                last_round = reply.round
        if time.monotonic() > give_up:
            raise TimeoutError(f"no round formed within {runtime.round_timeout:g}s")


def _build_group(runtime: Runtime, reply: protocol.JoinReply) -> None:
    assert reply.slot is not None and runtime.client is not None
    runtime.round = reply.round
    runtime.slot = reply.slot
    runtime.notice_seq = reply.notice_seq
    _publish_env(reply.slot)
    store = DriverStore(runtime.client, runtime.worker_id, timeout=runtime.collective_timeout)
    runtime.store = store
    prefixed = dist.PrefixStore(protocol.round_prefix(reply.round), store)
    before = open_socket_fds()
    try:
        _init_process_group(runtime, prefixed)
    finally:  # on failure too: the half-built group's connections must be cut
        with runtime.lock:
            runtime.round_sockets = new_tcp_sockets(before, runtime.driver_peer)


def _leave_round(runtime: Runtime) -> None:
    """Cuts this round's connections (peers blocked on us fail at once), then tears down."""
    with runtime.lock:
        sever(runtime.round_sockets)
        runtime.round_sockets = {}
    gc.collect(1)  # young cycles may still hold the old round's works
    _destroy_process_group()


def _round_broken(runtime: Runtime, broken_round: int) -> None:
    """Called by the watcher thread: the driver says a member of our round failed."""
    with runtime.lock:
        if runtime.round == broken_round and runtime.round_sockets:
            count = sever(runtime.round_sockets)
            runtime.round_sockets = {}
            log.debug("round %d broke; severed %d connection(s)", broken_round, count)


def _driver_lost(runtime: Runtime, reason: str) -> None:
    """Called by the watcher thread: nobody will ever tell this worker what to do again.
    It stops, with everything it started, instead of waiting forever."""
    try:
        sys.stderr.write(f"elasticrun: rank {runtime.slot.rank}: {reason}; the driver is "
                         f"gone, so this worker stops\n")
        sys.stderr.flush()
    finally:
        if os.getpgrp() == os.getsid(0):  # our own session, as elasticrun started us
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(1)


def _resolve(host: str, port: int) -> tuple[str, int]:
    try:
        return socket.gethostbyname(host), port
    except OSError:
        return host, port


def _init_process_group(runtime: Runtime, store: dist.Store | None = None) -> None:
    names_before = _group_count()
    try:
        dist.init_process_group(
            backend="gloo",
            store=store if store is not None else runtime.store,
            rank=runtime.slot.rank,
            world_size=runtime.slot.size,
            timeout=datetime.timedelta(seconds=runtime.collective_timeout),
        )
    except BaseException:
        # torch names a default group's store keys from a process-wide counter, so every
        # member must have built (and destroyed) as many groups as the others. Destroying a
        # group resets the counter; a failed attempt has nothing to destroy, so undo its step
        # (or this worker could never meet its peers again: they would wait on other keys).
        _set_group_count(names_before)
        raise


def _group_count() -> int | None:
    world = getattr(dist.distributed_c10d, "_world", None)
    return getattr(world, "group_count", None)


def _set_group_count(value: int | None) -> None:
    world = getattr(dist.distributed_c10d, "_world", None)
    if value is not None and world is not None and hasattr(world, "group_count"):
        world.group_count = value


def _destroy_process_group() -> None:
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as exc:  # a broken group may fail to tear down; it is abandoned
            log.debug("destroying the process group failed: %s", exc)


def _publish_env(slot: SlotInfo) -> None:
    """Keeps the environment true for code that reads it after a reset."""
    values = {
        protocol.ENV_RANK: slot.rank, protocol.ENV_SIZE: slot.size,
        protocol.ENV_LOCAL_RANK: slot.local_rank, protocol.ENV_LOCAL_SIZE: slot.local_size,
        protocol.ENV_CROSS_RANK: slot.cross_rank, protocol.ENV_CROSS_SIZE: slot.cross_size,
        "RANK": slot.rank, "WORLD_SIZE": slot.size, "LOCAL_RANK": slot.local_rank,
        "LOCAL_WORLD_SIZE": slot.local_size,
    }
    os.environ.update({name: str(value) for name, value in values.items()})
