"""Runs a job of `elasticrun.run(func)` in the calling process and brings its results back.

The driver runs on its own event loop in a helper thread, so that `run()` works the same
from a script, a notebook (whose thread already runs a loop) or any thread: signals reach
only the main thread, so the loop keeps the driver's signal handlers and the caller relays
its KeyboardInterrupt to them — the job stops as the CLI's does on SIGINT, every worker
with it.

A Ctrl-C must never be lost, whatever SIGINT handler the caller's process has: one left by
an earlier event loop or library would swallow it, and under SIG_DFL it would kill the
process without stopping the job. So while a job runs in the main thread, SIGINT raises
KeyboardInterrupt there (as `asyncio.run` does for its own main task), and the caller's
handler is put back afterwards. SIG_IGN is respected: a process that ignores Ctrl-C (a
background job) keeps ignoring it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any, BinaryIO, cast

import cloudpickle

from elasticrun.api.job_config import build_parts
from elasticrun.driver.driver import TASKS_STOP_S, Driver
from elasticrun.driver.processes.output import OutputRouter
from elasticrun.driver.rounds.state import JobState
from elasticrun.driver.server.results_api import ReceivedResult
from elasticrun.job.config import DriverConfig
from elasticrun.job.errors import JobFailedError
from elasticrun.system.process_setup import LogFormatter, raise_open_file_limit
from elasticrun.system.timed import within

SIGINT_CODE = 130
LOOP_CLOSE_S = 5.0  # what the driver left on its loop gets this long to finish


def run_function(config: DriverConfig, payload: bytes, env: Mapping[str, str],
                 log_level: str) -> list[Any]:
    """Runs the job whose workers run `payload` (cloudpickled func, args, kwargs); returns
    the results of the last round's workers in rank order. Raises ElasticrunError (the
    job failed), or KeyboardInterrupt once an interrupted job has stopped."""
    parts = build_parts(config)
    raise_open_file_limit()
    output = OutputRouter(_binary(sys.stdout), _binary(sys.stderr), config.output_filename,
                          config.prefix_timestamp)
    driver = Driver(config, parts, output, extra_env=env)
    driver.results.payload = payload
    try:
        with _logging(log_level):
            # Stopping: the workers' grace period and their kill, the driver's tasks,
            # its server and event sinks (each bounded by the driver).
            with interrupts_raise():
                code = DriverThread(driver).run(
                    stop_bound=config.stop_grace_period + TASKS_STOP_S + 10.0)
    finally:
        output.close()
    if code == SIGINT_CODE:
        raise KeyboardInterrupt
    if code != 0:
        raise JobFailedError(f"the job was interrupted (exit code {code})")
    return [_load(rank, host, data)
            for rank, host, data in last_round_results(driver.machine.state,
                                                       driver.results.received)]


def last_round_results(state: JobState, received: Mapping[str, ReceivedResult]
                       ) -> list[tuple[int, str, bytes]]:
    """(rank, host, pickled result) of every member of the last round, in rank order: the
    results that count, also when the membership changed on the way."""
    last = state.round
    if last is None:
        raise JobFailedError("the job ended before its first round")
    results = []
    for slot, worker_id in sorted(last.members.items(),
                                  key=lambda item: last.assignment[item[0]].rank):
        rank = last.assignment[slot].rank
        got = received.get(worker_id)
        if got is None:
            raise JobFailedError(
                f"rank {rank} on host {slot.host} exited 0 without sending its result "
                f"(did func end its process itself, with sys.exit() or os._exit()?)")
        if (got.round, got.rank) != (last.number, rank):
            raise JobFailedError(
                f"rank {rank} on host {slot.host} sent its result as rank {got.rank} of "
                f"round {got.round}, but the job ended in round {last.number}")
        results.append((rank, slot.host, got.data))
    return results


def _load(rank: int, host: str, data: bytes) -> Any:
    try:
        return cloudpickle.loads(data)
    except Exception as exc:
        raise JobFailedError(f"the result of rank {rank} (host {host}) cannot be unpickled "
                             f"here: {type(exc).__name__}: {exc}") from None


@contextlib.contextmanager
def interrupts_raise() -> Iterator[None]:
    """In the main thread: SIGINT raises KeyboardInterrupt for the block, then the previous
    handler is back. Elsewhere, under SIG_IGN, or with a handler Python did not install
    (which it could not put back), nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None or previous == signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class RelayLoop(asyncio.SelectorEventLoop):
    """An event loop for a thread other than the main one, where signals cannot be caught:
    it keeps the signal handlers added to it, and `deliver(sig)` calls one as if the
    signal had arrived."""

    def __init__(self) -> None:
        super().__init__()
        self._handlers: dict[int, tuple[Callable[..., object], tuple[Any, ...]]] = {}
        self.listened = False  # a handler was added (the driver has started)

    def add_signal_handler(self, sig: int, callback: Callable[..., object],  # type: ignore[override]
                           *args: Any) -> None:
        self._handlers[sig] = (callback, args)
        self.listened = True

    def remove_signal_handler(self, sig: int) -> bool:
        return self._handlers.pop(sig, None) is not None

    def deliver(self, sig: int) -> bool:
        """On the loop's thread: calls the handler of `sig`; False if there is none."""
        handler = self._handlers.get(sig)
        if handler is None:
            return False
        callback, args = handler
        callback(*args)
        return True


class DriverThread:
    """`Driver.run()` on a RelayLoop in a helper thread; the caller waits for it."""

    def __init__(self, driver: Driver) -> None:
        self._driver = driver
        self._loop = RelayLoop()
        self._main: asyncio.Task[int] | None = None
        self._code = 1
        self._error: BaseException | None = None
        # Waited on instead of Thread.join: a join that KeyboardInterrupt cuts off can take
        # the thread for ended (CPython gh-90882), and the next join returns at once.
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="elasticrun-driver",
                                        daemon=True)

    def run(self, stop_bound: float) -> int:
        """The driver's exit code; raises what it raised. On KeyboardInterrupt, the job is
        stopped (waiting at most `stop_bound` seconds for it) and the interrupt re-raised."""
        self._thread.start()
        try:
            while not self._done.wait(0.5):
                pass
        except KeyboardInterrupt:
            self._interrupt()
            self._done.wait(stop_bound)
            raise
        if self._error is not None:
            raise self._error
        return self._code

    def _run(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            self._main = loop.create_task(self._driver.run())
            self._code = loop.run_until_complete(self._main)
        except BaseException as exc:  # handed to the caller's thread
            self._error = exc
        finally:
            try:
                loop.run_until_complete(_close(loop))
            finally:
                asyncio.set_event_loop(None)
                loop.close()
                self._done.set()

    def _interrupt(self) -> None:
        """From the caller's thread: SIGINT for the driver (it stops the job). Before the
        driver listens for it, its run is cancelled (nothing has started yet); once it
        stopped listening, it is stopping the job already."""
        loop = self._loop

        def interrupt() -> None:
            if not loop.deliver(signal.SIGINT) and not loop.listened and self._main is not None:
                self._main.cancel()

        with contextlib.suppress(RuntimeError):  # the loop is closed: the job is over
            self._loop.call_soon_threadsafe(interrupt)


async def _close(loop: asyncio.AbstractEventLoop) -> None:
    """What asyncio.run does after its main task, each step bounded."""
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks(loop) if t is not current and not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=LOOP_CLOSE_S)
    with contextlib.suppress(asyncio.TimeoutError):
        await within(loop.shutdown_asyncgens(), LOOP_CLOSE_S)
    with contextlib.suppress(asyncio.TimeoutError):
        await within(loop.shutdown_default_executor(), LOOP_CLOSE_S)


@contextlib.contextmanager
def _logging(level: str) -> Iterator[None]:
    """elasticrun's messages at `level`, as the CLI prints them; where the caller set up
    logging (a root or an elasticrun handler), only the level is set, for the call."""
    logger = logging.getLogger("elasticrun")
    saved = logger.level, logger.propagate
    handler: logging.Handler | None = None
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(LogFormatter())
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level)
    try:
        yield
    finally:
        if handler is not None:
            logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


class _TextSink:
    """Bytes into a text stream without a binary buffer (a notebook's sys.stdout)."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, data: bytes) -> int:
        self._stream.write(data.decode(errors="replace"))
        return len(data)

    def flush(self) -> None:
        self._stream.flush()


def _binary(stream: IO[str]) -> BinaryIO:
    buffer = getattr(stream, "buffer", None)
    return cast(BinaryIO, buffer if buffer is not None else _TextSink(stream))
