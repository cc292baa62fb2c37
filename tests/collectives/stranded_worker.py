"""A worker whose round breaks while a collective is in flight that Gloo would hold.

Run as `python -m tests.collectives.stranded_worker RANK DIR MODE` by test_abandon.py, as
two ranks of one Gloo group over a FileStore in DIR. Rank 1 plays a peer that never joins
the collective (and is killed by the test). Rank 0 launches an allreduce on the data plane,
forgets its sockets (so cutting them releases nothing, as when Gloo lost a send), aborts the
round and abandons the work; then, by MODE:
  hold: keeps the round's group in a reference cycle (as an exception's traceback can),
        leaves, trains a round of its own and exits: the cycle is freed while the
        interpreter exits;
  last: exits with the broken round as its last one.
It prints the wall-clock time of the abort and the seconds from the abort to the end of its
script.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist

import elasticrun.torch as er
from elasticrun.protocol import SlotInfo
from elasticrun.torch.world import plane, runtime
from elasticrun.torch.world.groups import default_group
from elasticrun.torch.world.session import RoundSession
from elasticrun.worker.elastic import WorkersFailedError

COLLECTIVE_TIMEOUT_S = 30.0
_HELD: list[object] = []  # freed only while the interpreter exits


def join(number: int, rank: int, size: int, store_path: str) -> RoundSession:
    live = runtime._runtime or runtime.Runtime(collective_timeout=COLLECTIVE_TIMEOUT_S)
    slot = SlotInfo("localhost", rank, size, rank, size, 0, 1)
    live.session = RoundSession(number, slot, dist.FileStore(store_path, size),
                                collective_timeout=COLLECTIVE_TIMEOUT_S)
    live.session.build()
    runtime._runtime = live
    return live.session


def main(rank: int, directory: str, mode: str) -> None:
    import atexit
    atexit.register(runtime._close)  # as er.init() does
    session = join(1, rank, 2, f"{directory}/round1")
    if rank == 1:
        time.sleep(3 * COLLECTIVE_TIMEOUT_S)
        return
    # A data-plane work in flight (elasticrun's collectives negotiate first, which rank 1
    # would never answer either: the work itself is what Gloo holds).
    work = plane.all_reduce(torch.ones(1 << 12), async_op=True)
    session._sockets = {}
    session.abort()
    aborted = time.monotonic()
    print(f"aborted at {time.time():.3f}", flush=True)
    try:
        work.wait()
        raise AssertionError("the stranded allreduce returned")
    except WorkersFailedError:
        pass
    if mode == "hold":
        _HELD.append(default_group())
        _HELD.append(_HELD)
        session.leave()
        join(2, 0, 1, f"{directory}/round2")
        er.allreduce(torch.ones(4), name="alone")
    print(f"script ends {time.monotonic() - aborted:.2f} s after the abort", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
