"""Joining a round: ask the driver for this worker's place in the next round and build the
round's group, asking again for the round after it when the build fails (a peer died, hung,
or the round broke while the group was being built), within the runtime's round timeout.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from typing import Protocol

from elasticrun import protocol
from elasticrun.torch.world.devices import DataPlane
from elasticrun.torch.world.session import Connect, RoundSession
from elasticrun.worker import timeline
from elasticrun.worker.client import DriverClient
from elasticrun.worker.elastic import WorkersFailedError, describe_failure
from elasticrun.worker.liveness import StallWatch
from elasticrun.worker.notices import NoticeWatcher
from elasticrun.worker.store import DriverStore

log = logging.getLogger("elasticrun.worker")


@dataclass
class JoinTiming:
    """Wall-clock times of this worker's last join (for benchmarks and debugging)."""

    asked: float = 0.0  # the join request was sent
    assigned: float = 0.0  # the driver answered with this worker's place in the round
    built: float = 0.0  # the round's process group is built


class Joiner(Protocol):
    """What a join needs of the runtime. `session` is set before the group is built, so that
    a round that breaks meanwhile can be aborted from another thread."""

    client: DriverClient | None
    worker_id: str
    collective_timeout: float
    round_timeout: float
    driver_peer: tuple[str, int]
    plane: DataPlane
    session: RoundSession | None
    stall_watch: StallWatch | None
    notices: NoticeWatcher | None
    shard_size: int


def join_next_round(runtime: Joiner, connect: Connect, last_round: int, failure: str,
                    committed: bool) -> JoinTiming:
    """Joins the round after `last_round` (`failure`: why this worker left it, "" for a host
    change; `committed`: whether it completed a commit there) and builds its group. Exits
    the process (code 0) when the driver says this worker has no place in the job."""
    client = runtime.client
    assert client is not None
    give_up = time.monotonic() + runtime.round_timeout
    timing = JoinTiming(asked=time.time())
    asked = timing.asked  # of this request (after a failed build, a new one)
    while True:
        reply = protocol.JoinReply.from_json(client.call(
            protocol.PATH_JOIN,
            {"worker_id": runtime.worker_id, "last_round": last_round,
             "failure": failure, "committed": committed},
            wait=protocol.MAX_POLL_S,
        ))
        if reply.action == "exit":
            timeline.instant("leaves the job", "round", reason=reply.reason)
            print(f"elasticrun: this worker leaves the job ({reply.reason})", file=sys.stderr)
            raise SystemExit(0)
        if reply.action == "run" and reply.slot is not None:
            timing.assigned = time.time()
            timeline.record("rendezvous", "round", asked, timing.assigned,
                            round=reply.round, last_round=last_round, failure=failure)
            store = DriverStore(client, runtime.worker_id, timeout=runtime.collective_timeout)
            session = RoundSession.for_reply(reply, store, runtime.collective_timeout,
                                             runtime.driver_peer, runtime.plane,
                                             runtime.stall_watch, runtime.shard_size)
            if runtime.stall_watch is not None:
                runtime.stall_watch.clock.restart()
            runtime.session = session
            if runtime.notices is not None and runtime.notices.broken_round >= reply.round:
                session.abort()  # it broke as the reply came: the watcher found no session
            session.publish_env()
            try:
                session.build(connect)
            except WorkersFailedError as exc:
                timeline.record("build group", "round", timing.assigned, time.time(),
                                round=reply.round, error=describe_failure(exc))
                if time.monotonic() > give_up:
                    raise
                log.warning("building round %d's group failed (%s); asking for a new round",
                            reply.round, exc)
                session.leave()
                last_round, failure, committed = reply.round, describe_failure(exc), False
                asked = time.time()
            else:
                timing.built = time.time()
                timeline.record("build group", "round", timing.assigned, timing.built,
                                round=reply.round, rank=reply.slot.rank, size=reply.slot.size)
                return timing
        if time.monotonic() > give_up:
            raise TimeoutError(f"no round formed within {runtime.round_timeout:g}s")
