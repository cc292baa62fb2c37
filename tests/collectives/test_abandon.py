"""A round's abort releases a collective that cutting its sockets cannot.

Gloo loses a send that hits a peer's death at the moment it is written (the write fails with
EPIPE/ECONNRESET, the send is queued, and the pair's failure signals only bound buffers):
its wait then lasts the whole collective timeout, however the sockets are cut. Here a rank
that never comes plays the dead peer, and the session forgets its sockets, so that only the
session's own release can end the wait: the survivors must raise WorkersFailedError at
once, and leaving the round must not wait for the abandoned work either.
"""

from __future__ import annotations

from tests.collectives.world import COLLECTIVE_TIMEOUT_S, GlooWorld


def _stranded(rank: int) -> dict[str, object]:
    import threading
    import time

    import torch

    import elasticrun.torch as hvd
    from elasticrun.torch import runtime
    from elasticrun.worker.elastic import WorkersFailedError

    if rank == 2:  # alive, in the group, but never joins the collective
        time.sleep(4.0)
        return {}
    session = runtime.current().session
    assert session is not None
    handle = hvd.allreduce_async(torch.ones(1 << 12), name="stranded")
    session._sockets = {}  # cutting the connections releases nothing now
    threading.Timer(0.5, session.abort).start()
    started = time.monotonic()
    try:
        hvd.synchronize(handle)
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
