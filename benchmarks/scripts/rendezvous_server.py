"""The driver's real worker server and round machine, alone in their process, for
benchmarks/rendezvous_scale.py.

`python rendezvous_server.py N` (the job secret in ELASTICRUN_SECRET): seeds the machine's
state with N workers w0..w{N-1} on N/8 hosts of 8 slots and round 1 open for all of them
(worker wI holds rank I), serves on 127.0.0.1 and prints its port. Every join goes through
the real machine (a JoinAsked event, answered by its AnswerJoin action), carried out by a
minimal executor: the driver's own event queue, the server carrying out its actions; no
processes, no telemetry. Then, for
each line read on stdin, prints the CPU seconds it spent since the last one (so the
benchmark can tell its phases apart); exits when stdin closes. BENCH_PROFILE=FILE writes a
cProfile (in CPU time) of the serving.
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import sys
import time

from kit import report_cpu_per_line

from elasticrun import protocol
from elasticrun.driver.processes.records import new_worker_id
from elasticrun.driver.queue import EventQueue
from elasticrun.driver.rounds import events as ev
from elasticrun.driver.rounds.assignment import SlotId, assign
from elasticrun.driver.rounds.machine import RoundMachine
from elasticrun.driver.rounds.state import JobPhase, Round, WorkerRecord
from elasticrun.driver.server.app import WorkerServer
from elasticrun.job.config import DriverConfig
from elasticrun.system.process_setup import raise_open_file_limit

SLOTS_PER_HOST = 8


class Executor:
    """The driver's event queue and the server's own actions; the rest (spawns,
    telemetry, logs) is dropped, so only the serving is measured."""

    def __init__(self, workers: int, secret: str) -> None:
        config = DriverConfig(command=("x",), np=workers, min_np=workers, max_np=None)
        self.machine = RoundMachine(config, new_worker_id)
        self.server = WorkerServer(secret, self.machine.state, self.post)
        self._queue = EventQueue(self.machine.handle, self.server.carry_out)

    def post(self, event: ev.Event) -> None:
        self._queue.post(event)

    def seed(self, workers: int) -> None:
        """N workers (started) and round 1 open for all of them, as the machine's first cut
        leaves its state, the hosts discovered; wI holds rank I."""
        state = self.machine.state
        hosts = [(f"host{h}", min(SLOTS_PER_HOST, workers - h * SLOTS_PER_HOST))
                 for h in range(-(-workers // SLOTS_PER_HOST))]
        assignment = assign(hosts)
        state.hosts.update(dict(hosts))
        members: dict[SlotId, str] = {}
        for slot, info in assignment.items():
            members[slot] = f"w{info.rank}"
            state.workers[members[slot]] = WorkerRecord(members[slot], slot, info.rank)
        state.round = Round(1, assignment, members, state.notice_seq, time.monotonic())
        state.phase = JobPhase.RUNNING
        self.server.carry_out(ev.OpenRound(1, assignment, 0))

    async def stop(self) -> None:
        self._queue.close()
        await self.server.stop()


async def serve(workers: int, profile: cProfile.Profile | None) -> None:
    executor = Executor(workers, os.environ[protocol.ENV_SECRET])
    executor.seed(workers)
    print(await executor.server.start("127.0.0.1"), flush=True)
    if profile is not None:
        profile.enable()
    await report_cpu_per_line()
    if profile is not None:
        profile.disable()
    await executor.stop()


def main() -> None:
    raise_open_file_limit()
    profile_path = os.environ.get("BENCH_PROFILE")
    profile = cProfile.Profile(time.process_time) if profile_path else None
    asyncio.run(serve(int(sys.argv[1]), profile))
    if profile is not None and profile_path:
        profile.dump_stats(profile_path)


if __name__ == "__main__":
    main()
