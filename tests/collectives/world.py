"""A world of N real worker processes joined by a real Gloo group, without a driver.

Collective tests need many ranks but not the launcher: `GlooWorld(n)` starts n processes
once (forked from a server that imported torch once: a world rebuilt after a failing call
costs no imports), builds one round's group over a FileStore, and `world.run(fn, *args)` runs
`fn(*args)` on every rank and returns the results in rank order. `fn` must be importable
(a module-level function). A rank that raises fails the call with its traceback, and the
world is rebuilt for the next call (its peers may be stuck in a collective).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Imported once, by multiprocessing's fork server, before it forks the ranks (torch has run
# no computation there: as safe as DataLoader's fork).
PRELOAD = ["torch", "torch.distributed", "elasticrun.torch", "elasticrun.torch.world.session",
           "elasticrun.torch.world.devices", "tests.collectives.world"]
COLLECTIVE_TIMEOUT_S = 15.0
CALL_TIMEOUT_S = 60.0


def _serve(rank: int, size: int, store_path: str, tasks: Any, results: Any,
           backend: str) -> None:
    import os

    import torch
    import torch.distributed as dist

    from elasticrun.protocol import SlotInfo
    from elasticrun.torch.world import runtime
    from elasticrun.torch.world.devices import DataPlane, nccl_environment
    from elasticrun.torch.world.session import RoundSession

    torch.set_num_threads(1)  # as elasticrun's workers that share a host (OMP_NUM_THREADS)
    slot = SlotInfo("localhost", rank, size, rank, size, 0, 1)
    live = runtime.Runtime(collective_timeout=COLLECTIVE_TIMEOUT_S)
    if backend != "cpu":  # every rank on cuda:0; NCCL: each rank its own NCCL host
        os.environ["NCCL_HOSTID"] = f"gloo-world-{os.getpid()}"
        nccl_environment(os.environ, COLLECTIVE_TIMEOUT_S)
        live.plane = DataPlane(backend, torch.device("cuda", 0))
        torch.cuda.set_device(0)
    live.session = RoundSession(1, slot, dist.FileStore(store_path, size),
                                collective_timeout=COLLECTIVE_TIMEOUT_S,
                                backend=live.plane.backend, device=live.plane.device)
    live.session.build()
    runtime._runtime = live
    results.put(("ready", rank, None))
    while True:
        task = tasks.get()
        if task is None:
            break
        fn, args = task
        try:
            results.put(("ok", rank, fn(*args)))
        except BaseException:  # noqa: BLE001 - reported to the test, which fails
            results.put(("error", rank, traceback.format_exc()))
    runtime.shutdown()


class WorldError(AssertionError):
    """A rank raised, or did not answer in time."""


class GlooWorld:
    """`backend`: "cpu" (CPU ranks on Gloo), or with every rank on cuda:0, "gloo" (CUDA
    tensors through host memory) or "nccl"."""

    def __init__(self, size: int, backend: str = "cpu") -> None:
        self.size = size
        self.backend = backend
        self._context = mp.get_context("forkserver")
        self._context.set_forkserver_preload(PRELOAD)
        self._processes: list[Any] = []
        self._start()

    def _start(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="gloo-world-")
        store_path = str(Path(self._dir.name) / "store")
        self._results = self._context.Queue()
        self._tasks = [self._context.Queue() for _ in range(self.size)]
        self._processes = [
            self._context.Process(target=_serve, daemon=True,
                                  args=(rank, self.size, store_path, self._tasks[rank],
                                        self._results, self.backend))
            for rank in range(self.size)
        ]
        for process in self._processes:
            process.start()
        self._collect("ready")

    def _collect(self, what: str) -> list[Any]:
        answers: dict[int, Any] = {}
        errors: list[str] = []
        while len(answers) + len(errors) < self.size:
            try:
                status, rank, value = self._results.get(timeout=CALL_TIMEOUT_S)
            except queue.Empty:
                missing = sorted(set(range(self.size)) - set(answers))
                self._restart()
                raise WorldError(f"{what}: rank(s) {missing} did not answer within "
                                 f"{CALL_TIMEOUT_S:g}s") from None
            if status == "error":
                errors.append(f"rank {rank}:\n{value}")
                # the others may wait for it in a collective until their timeout
            else:
                answers[rank] = value
        if errors:
            self._restart()
            raise WorldError(f"{what} failed on {len(errors)} rank(s):\n" + "\n".join(errors))
        return [answers[rank] for rank in range(self.size)]

    def run(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """`fn(*args)` on every rank; the results in rank order."""
        for tasks in self._tasks:
            tasks.put((fn, args))
        return self._collect(getattr(fn, "__name__", repr(fn)))

    def run_per_rank(self, fn: Callable[..., Any], per_rank: list[tuple[Any, ...]]) -> list[Any]:
        """`fn(*per_rank[rank])` on each rank."""
        for tasks, args in zip(self._tasks, per_rank, strict=True):
            tasks.put((fn, args))
        return self._collect(getattr(fn, "__name__", repr(fn)))

    def _restart(self) -> None:
        self._stop()
        self._start()

    def _stop(self) -> None:
        for tasks in self._tasks:
            try:
                tasks.put(None)
            except (OSError, ValueError):
                pass
        for process in self._processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        self._dir.cleanup()

    def close(self) -> None:
        self._stop()
