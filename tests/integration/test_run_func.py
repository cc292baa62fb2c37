"""`elasticrun.run(func)`: the driver in this process, real workers, real Gloo.

Every function here is defined inside its test, so cloudpickle carries it by value (a
module-level function of a test module is pickled by reference, and workers cannot import
test modules). Each job's workers carry a tag in their environment (run's `env=`); after
the job, nothing with the tag may be left.
"""

from __future__ import annotations

import _thread
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import elasticrun
from elasticrun.job.errors import JobFailedError
from tests.integration.harness import SESSION_TAG, TAG_VAR, assert_no_orphans


def _tag() -> dict[str, str]:
    return {TAG_VAR: f"{SESSION_TAG}.{uuid.uuid4().hex}"}


def test_two_workers_return_their_results_in_rank_order() -> None:
    env = _tag()
    offset = 100  # captured by the closure

    def work(a: int, scale: int = 1) -> tuple[int, int, float, int]:
        import torch

        import elasticrun.torch as er
        total = er.allreduce(torch.tensor(float(er.rank())), op=er.Sum).item()
        return er.rank(), er.size(), total, offset + a * scale

    results = elasticrun.run(work, args=(3,), kwargs={"scale": 2}, np=2, env=env)
    assert results == [(0, 2, 1.0, 106), (1, 2, 1.0, 106)]
    assert_no_orphans(env[TAG_VAR], within=0)  # gone when run() is


def test_three_workers_and_a_lambda() -> None:
    env = _tag()

    def ranks_seen() -> list[int]:
        import elasticrun.torch as er
        return er.allgather_object(er.rank())

    results = elasticrun.run(lambda base: (base, ranks_seen()), args=(7,), np=3, env=env,
                             log_level="WARNING")
    assert results == [(7, [0, 1, 2])] * 3
    assert_no_orphans(env[TAG_VAR], within=0)  # gone when run() is


def test_an_exception_in_func_names_its_rank_and_message() -> None:
    env = _tag()

    def work() -> int:
        import elasticrun.torch as er
        if er.rank() == 1:
            raise ValueError("no data for shard 17")
        er.allgather_object(er.rank())  # rank 0 waits for rank 1: the job fails, not ends
        return er.rank()

    started = time.monotonic()
    with pytest.raises(JobFailedError) as failure:
        elasticrun.run(work, np=2, env=env)
    message = str(failure.value)
    assert "rank 1 on host localhost failed: ValueError: no data for shard 17" in message
    assert time.monotonic() - started < 30
    assert_no_orphans(env[TAG_VAR], within=0)  # gone when run() is


def test_a_result_that_cannot_be_pickled_is_a_clear_error() -> None:
    env = _tag()
    with pytest.raises(JobFailedError, match=r"rank 0 on host localhost failed: the result "
                                             r"of func cannot be pickled: TypeError: .*lock"):
        elasticrun.run(lambda: threading.Lock(), np=1, env=env)
    assert_no_orphans(env[TAG_VAR], within=0)  # gone when run() is


def test_a_worker_that_exits_0_without_its_result_is_a_clear_error() -> None:
    env = _tag()

    def work() -> None:
        import os
        os._exit(0)

    with pytest.raises(JobFailedError, match="rank 0 on host localhost exited 0 without "
                                             "sending its result"):
        elasticrun.run(work, np=1, env=env)
    assert_no_orphans(env[TAG_VAR], within=0)  # gone when run() is


def test_elastic_training_inside_func_returns_the_last_rounds_results() -> None:
    """Rank 2 (alone on host 127.0.0.1) dies at step 2: the survivors roll back, go on as
    a world of 2 and return; the results are theirs, in the last round's rank order."""
    env = _tag()

    def train() -> tuple[int, int, int]:
        import os

        import torch

        import elasticrun.torch as er
        state = er.elastic.ObjectState(step=0)

        @er.elastic.run
        def loop(state: Any) -> tuple[int, int, int]:
            while state.step < 5:
                if state.step == 2 and er.size() == 3 and er.rank() == 2:
                    os._exit(1)
                er.allreduce(torch.tensor(1.0))
                state.step += 1
                state.commit()
            return er.rank(), er.size(), state.step

        return loop(state)

    # A collective that hangs fails within 20 s, not the default 60 s.
    results = elasticrun.run(train, np=3, min_np=2, hosts="localhost:2,127.0.0.1:1",
                             collective_timeout=20, env=env, log_level="WARNING")
    assert results == [(0, 2, 5), (1, 2, 5)]
    assert_no_orphans(env[TAG_VAR], within=0)  # gone when run() is


def _foreign_handler(signum: int, frame: Any) -> None:
    """A SIGINT handler that swallows the interrupt: one left by an earlier event loop, or a
    library's (the cause of a Ctrl-C once lost in the full suite)."""


@pytest.mark.parametrize("installed, deliver", [
    (signal.default_int_handler, "signal"),  # a real SIGINT, Python's own handler
    (_foreign_handler, "interrupt_main"),
    (signal.SIG_DFL, "interrupt_main"),  # a real SIGINT would kill the process outright
], ids=["default-handler", "foreign-handler", "SIG_DFL"])
def test_keyboard_interrupt_stops_every_worker(tmp_path: Path, installed: Any,
                                               deliver: str) -> None:
    env = _tag()
    marks = str(tmp_path)

    def work() -> None:
        import os
        import pathlib
        import time

        pathlib.Path(marks, os.environ["ELASTICRUN_RANK"]).touch()
        time.sleep(120)

    def interrupt_when_running() -> None:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        if deliver == "signal":
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
        else:
            _thread.interrupt_main()  # what a Ctrl-C does in the caller's thread

    interrupter = threading.Thread(target=interrupt_when_running, daemon=True)
    previous = signal.signal(signal.SIGINT, installed)
    try:
        interrupter.start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            elasticrun.run(work, np=2, env=env)
        interrupter.join(5)
        assert signal.getsignal(signal.SIGINT) is installed  # the caller's handler is back
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(list(tmp_path.iterdir())) == 2 and time.monotonic() - started < 60
    assert_no_orphans(env[TAG_VAR], within=0)
