"""A round's abort releases a collective that cutting its sockets cannot.

Gloo loses a send that hits a peer's death at the moment it is written (the write fails with
EPIPE/ECONNRESET, the send is queued, and the pair's failure signals only bound buffers):
its wait then lasts the whole collective timeout, however the sockets are cut. Here a rank
that never comes plays the dead peer, and the session forgets its sockets, so that only the
session's own release can end the wait: the survivors must raise WorkersFailedError at
once, and leaving the round must not wait for the abandoned work either. Nor may the
worker's exit, however long the abandoned work runs on in Gloo (stranded_worker.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.collectives import stranded_worker
from tests.collectives.world import COLLECTIVE_TIMEOUT_S, GlooWorld

REPO = Path(__file__).resolve().parents[2]


def _stranded(rank: int) -> dict[str, object]:
    import threading
    import time

    import torch

    import elasticrun.torch as hvd
    from elasticrun.torch.world import runtime
    from elasticrun.worker.elastic import WorkersFailedError

    if rank == 2:  # alive, in the group, but never joins the collective
        time.sleep(4.0)
        return {}
    session = runtime.current().session
    assert session is not None
    session._sockets = {}  # cutting the connections releases nothing now
    threading.Timer(0.5, session.abort).start()
    started = time.monotonic()
    try:  # the negotiation before the data waits for rank 2 too, abortably
        hvd.synchronize(hvd.allreduce_async(torch.ones(1 << 12), name="stranded"))
        outcome = "returned"
    except WorkersFailedError as exc:
        outcome = str(exc)
    released = time.monotonic() - started
    started = time.monotonic()
    session.leave()
    return {"outcome": outcome, "released_s": released, "left_s": time.monotonic() - started}


def test_an_aborted_round_releases_and_leaves_a_collective_gloo_would_hold() -> None:
    world = GlooWorld(3)  # not a shared one: its round is left
    try:
        results = world.run_per_rank(_stranded, [(0,), (1,), (2,)])
    finally:
        world.close()
    for result in results[:2]:
        assert "broke while a collective was in flight" in str(result["outcome"]), result
        # Released by the abort (at 0.5 s), not by Gloo's timeout.
        assert float(result["released_s"]) < COLLECTIVE_TIMEOUT_S / 3, result
        assert float(result["left_s"]) < COLLECTIVE_TIMEOUT_S / 3, result


@pytest.mark.parametrize("mode", ["hold", "last"])
def test_a_worker_with_an_abandoned_collective_exits_at_once(tmp_path: Path, mode: str) -> None:
    """The abandoned work runs on until Gloo's collective timeout. Exiting must not wait for
    it: neither when the broken round's group is freed only as the interpreter exits (it
    used to sit out the timeout, then abort: "terminate called after throwing an instance
    of 'gloo::IoException'", exit code 134), nor when the broken round is the last one."""
    def start(rank: int) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.collectives.stranded_worker", str(rank),
             str(tmp_path), mode], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)

    peer = start(1)
    try:
        worker = start(0)
        out, err = worker.communicate(timeout=3 * stranded_worker.COLLECTIVE_TIMEOUT_S)
        exited = time.time()
    finally:
        peer.kill()
        peer.wait()
    assert worker.returncode == 0, f"exit code {worker.returncode}:\n{out}\n{err}"
    assert "script ends" in out, out + err
    # From the abort, not from the start: two torch imports beside a busy machine take
    # seconds that say nothing about the exit.
    aborted = float(re.search(r"aborted at ([0-9.]+)", out).group(1))  # type: ignore[union-attr]
    assert exited - aborted < stranded_worker.COLLECTIVE_TIMEOUT_S / 2, (exited - aborted, out,
                                                                          err)
