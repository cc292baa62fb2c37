"""A peer lost while a round's group connects costs at most the collective timeout.

Gloo waits up to five times its group's timeout for a peer to connect to it, in a wait that
no abort ends: a peer that published its address and then died (the chaos soak lost one
so) held every rank waiting on it for 5 minutes at the default 60 s. The group now connects
under a fifth of the collective timeout, and its collectives get the whole of it.

Here the last rank is a process of its own that publishes its address and is SIGKILLed
before it connects (this module, run as `python -m tests.collectives.test_group_connect`);
five ranks of a Gloo world then build the group with it. Which side of a pair waits for
the other is Gloo's choice: the lower address waits. The lost rank's published port is
made the highest (65535; no survivor connects to it), so every survivor waits for it.
(With its real port, each survivor waited about every other time, and in some runs none
did: the kernel hands out ports in an order of its own.) The lost rank is the last: each rank
connects its pairs in rank order, so the survivors' pairs are connected before any of them
comes to it, and no wait follows another.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.collectives.world import GlooWorld

TIMEOUT_S = 10.0  # the collective timeout: the group connects under 2 s
SIZE = 6
PREFIX = "connect/"
REPO = Path(__file__).resolve().parents[2]


def _slot(rank: int) -> Any:
    from elasticrun.protocol import SlotInfo

    return SlotInfo("localhost", rank, SIZE, rank, SIZE, 0, 1)


def _build(rank: int, store_path: str) -> tuple[float, str] | None:
    """A survivor: seconds until its build failed, and why (None: it was built)."""
    import torch.distributed as dist

    from elasticrun.torch.world import groups, runtime

    session = runtime.current().session
    assert session is not None
    session.leave()  # this world's own group; a fresh one is built below
    store = dist.PrefixStore(PREFIX, dist.FileStore(store_path, SIZE))
    started = time.monotonic()
    try:
        groups.init_process_group(_slot(rank), store, TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - every survivor's build must fail
        return time.monotonic() - started, str(exc)[-120:]
    groups.destroy_process_group()
    return None


def _highest_port(rank_info: bytes) -> bytes:
    """Gloo's record of a rank (its host name, its listening address, one identifier per
    pair) with the address's port made 65535: every survivor's own port is lower, so each
    is the side of its pair that waits for this rank to connect (Gloo: the lower address
    waits), where with the real port about half of them would, by chance."""
    record = bytearray(rank_info)
    name_length = int.from_bytes(record[:8], "little")
    address = 8 + name_length + 8  # the name, then the address's own length
    family, port = record[address:address + 2], address + 2
    assert family == socket.AF_INET.to_bytes(2, "little"), f"not Gloo's record: {rank_info!r}"
    record[port:port + 2] = (65535).to_bytes(2, "big")
    return bytes(record)


def lose_after_publishing(store_path: str) -> None:
    """The last rank: publishes its address, and dies as it would fetch its peers'."""
    import torch.distributed as dist

    from elasticrun.torch.world import groups

    class PublishThenDie(dist.Store):
        def __init__(self, inner: dist.Store) -> None:
            super().__init__()
            self.inner = inner

        def set(self, key: str, value: Any) -> None:
            self.inner.set(key, _highest_port(value))

        def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
            os.kill(os.getpid(), signal.SIGKILL)

        def get(self, key: str) -> bytes:
            os.kill(os.getpid(), signal.SIGKILL)
            raise AssertionError("unreachable")

    store = PublishThenDie(dist.PrefixStore(PREFIX, dist.FileStore(store_path, SIZE)))
    groups.init_process_group(_slot(SIZE - 1), store, TIMEOUT_S)


def test_a_peer_lost_while_the_group_connects_costs_at_most_the_collective_timeout(
        tmp_path: Path) -> None:
    from elasticrun.torch.world.groups import connect_timeout

    store_path = str(tmp_path / "store")
    lost = subprocess.run([sys.executable, "-m", "tests.collectives.test_group_connect",
                           store_path], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert lost.returncode == -signal.SIGKILL, lost.stderr[-2000:]
    world = GlooWorld(SIZE - 1)  # not a shared one: its round is left
    try:
        failed = world.run_per_rank(_build, [(rank, store_path) for rank in range(SIZE - 1)])
    finally:
        world.close()
    assert all(outcome is not None for outcome in failed), failed
    # Before: a survivor waiting on the lost rank failed after 5 x 10 s. Each waited (none
    # was refused at once): the lost rank's connection is what they all waited for.
    waited = [outcome[0] for outcome in failed if outcome is not None]
    assert max(waited) < TIMEOUT_S + 5, failed
    assert min(waited) >= connect_timeout(TIMEOUT_S), failed


if __name__ == "__main__":
    lose_after_publishing(sys.argv[1])
