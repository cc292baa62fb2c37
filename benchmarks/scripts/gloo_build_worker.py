"""Worker of the "gloo" benchmark: times Gloo process-group builds through two stores.

After `er.init()` (round 1 joined, default group built: not timed), rank 0 hosts a torch
`TCPStore` and shares its port. Then for each trial, for each store in turn (the order
alternates between trials): a barrier on the default group, then the timed part, building
a NEW Gloo group of all ranks through that store and running one small allreduce on it.

The group is built with `dist.ProcessGroupGloo(PrefixStore(...), rank, size, timeout)`:
exactly the backend that `dist.init_process_group(backend="gloo", store=...)` builds on
elasticrun's reset (it wraps the store in two more PrefixStores and constructs this class),
so the store sees the same traffic (inside the driver store's `full_mesh`, as in a round's
session); but the default group stays up to synchronise trials,
which destroying and re-initialising the default group would not allow. Each build uses a
fresh key prefix under the current round (the driver only lets a round's members use its
keys). A group is dropped when the next is built, after the barrier: every rank is done
with it by then.

Env: BENCH_TRIALS (trials per store, the first of which is a warm-up), kit.py's BENCH_OUT
(JSON lines file). Each rank writes one line per build: time, store, trial, rank, seconds, and
`requests`, the driver-store requests it made by operation (empty for the TCPStore).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import time
from typing import Any

import torch
import torch.distributed as dist
from kit import append_json, env_int, free_port

import elasticrun.torch as er
from elasticrun import protocol
from elasticrun.torch.world import runtime

TRIALS = env_int("BENCH_TRIALS", 3)


def count_requests(client: Any) -> collections.Counter[str]:
    """Counts this process's driver-store requests by operation (wraps `client.call`)."""
    counts: collections.Counter[str] = collections.Counter()
    call = client.call

    def counting_call(path: str, *args: Any, **kwargs: Any) -> Any:
        if path.startswith(protocol.PATH_KV_PREFIX):
            counts[path[len(protocol.PATH_KV_PREFIX):]] += 1
        return call(path, *args, **kwargs)

    client.call = counting_call
    return counts


def main() -> None:
    er.init()
    rt = runtime.current()
    assert rt.store is not None and rt.client is not None, "run this under elasticrun"
    rank, size = rt.slot.rank, rt.slot.size
    timeout = datetime.timedelta(seconds=rt.collective_timeout)
    counts = count_requests(rt.client)

    port = [free_port() if rank == 0 else 0]
    dist.broadcast_object_list(port, src=0)
    tcp_store = dist.TCPStore("127.0.0.1", port[0], size, is_master=rank == 0,
                              timeout=timeout)
    stores: dict[str, dist.Store] = {"driver": rt.store, "tcp": tcp_store}
    prefix = protocol.round_prefix(rt.round) + "bench/"

    for trial in range(TRIALS):
        order = ["driver", "tcp"] if trial % 2 == 0 else ["tcp", "driver"]
        for name in order:
            dist.barrier()  # after it, the last group (dropped below) is unused
            counts.clear()
            start = time.perf_counter()
            # as a round's session does: the driver's store fetches every address at once
            mesh = rt.store.full_mesh(size) if name == "driver" else contextlib.nullcontext()
            with mesh:
                group: Any = dist.ProcessGroupGloo(  # torch's stubs lack its allreduce
                    dist.PrefixStore(f"{prefix}{name}/{trial}/", stores[name]),
                    rank, size, timeout)
            group.allreduce([torch.ones(4)]).wait()
            seconds = time.perf_counter() - start
            append_json({"time": time.time(), "store": name, "trial": trial, "rank": rank,
                         "size": size, "seconds": seconds, "requests": dict(counts)})
    dist.barrier()
    del group
    er.shutdown()


if __name__ == "__main__":
    main()
