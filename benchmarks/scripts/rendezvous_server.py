"""The driver's real rendezvous server, alone in its process, for benchmarks/rendezvous_scale.py.

`python rendezvous_server.py N` (the job secret in ELASTICRUN_SECRET): registers N workers
w0..w{N-1} on N/8 hosts of 8 slots, opens round 1 for all of them (worker wI holds rank I),
serves on 127.0.0.1 and prints its port. Then, for each line read on stdin, prints the CPU
seconds it spent since the last one (so the benchmark can tell its phases apart); exits when
stdin closes. BENCH_PROFILE=FILE writes a cProfile (in CPU time) of the serving.
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import resource
import sys
import time

from elasticrun import protocol
from elasticrun.driver.assignment import SlotId, assign
from elasticrun.driver.rendezvous import Rendezvous

SLOTS_PER_HOST = 8


class QuietDriver:
    """The RendezvousListener protocol, doing nothing: only the server is measured."""

    def barrier_started(self, round_number: int) -> None: ...

    def reset_requested(self, worker_id: str, last_round: int) -> None: ...

    def worker_released(self, worker_id: str) -> None: ...

    def worker_joined(self, worker_id: str, round_number: int, rank: int) -> None: ...

    def standby_ready(self, worker_id: str) -> None: ...

    def round_completed(self, round_number: int) -> None: ...

    def worker_synced(self, worker_id: str, round_number: int) -> None: ...


async def serve(workers: int, profile: cProfile.Profile | None) -> None:
    rv = Rendezvous(os.environ[protocol.ENV_SECRET], QuietDriver())
    hosts = [(f"host{h}", min(SLOTS_PER_HOST, workers - h * SLOTS_PER_HOST))
             for h in range(-(-workers // SLOTS_PER_HOST))]
    assignment = assign(hosts)
    members: dict[SlotId, str] = {}
    for slot, info in assignment.items():
        members[slot] = f"w{info.rank}"
        rv.register_worker(f"w{info.rank}", slot)
    rv.open_round(1, assignment, members)
    print(await rv.start("127.0.0.1"), flush=True)
    if profile is not None:
        profile.enable()
    loop = asyncio.get_running_loop()
    mark = time.process_time()
    while await loop.run_in_executor(None, sys.stdin.readline):  # "" at EOF
        now = time.process_time()
        print(now - mark, flush=True)
        mark = now
    if profile is not None:
        profile.disable()
    await rv.stop()


def main() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    profile_path = os.environ.get("BENCH_PROFILE")
    profile = cProfile.Profile(time.process_time) if profile_path else None
    asyncio.run(serve(int(sys.argv[1]), profile))
    if profile is not None and profile_path:
        profile.dump_stats(profile_path)


if __name__ == "__main__":
    main()
