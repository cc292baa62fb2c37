"""A worker that runs under an `elasticrun agent`, as the driver sees it: its output and
exit come as messages on the agent's connection, and it is stopped, or its process state
asked (it may be hung), by one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from elasticrun.launch.agents import wire
from elasticrun.system.process_view import ProcessState, ProcessView
from elasticrun.system.timed import within

OUTPUT_LIMIT = 1024 * 1024  # bytes a reader buffers for one line (as in local.py)
EXIT_AGENT_LOST = 255  # the agent went away before the worker's exit was known
STOP_EXTRA_WAIT_S = 5.0  # after the grace period, for the agent's report

Send = Callable[[wire.Message], Awaitable[None]]


class AgentProcess:
    def __init__(self, worker: str, send: Send) -> None:
        self.worker = worker
        self._send = send
        self.stdout = asyncio.StreamReader(limit=OUTPUT_LIMIT)
        self.stderr = asyncio.StreamReader(limit=OUTPUT_LIMIT)
        loop = asyncio.get_running_loop()
        self.started: asyncio.Future[str | None] = loop.create_future()  # None, or an error
        self._exit: asyncio.Future[int] = loop.create_future()
        self._ended_streams: set[str] = set()
        self._inspected: asyncio.Future[ProcessView] | None = None  # an answer awaited
        self.host_lost = False  # it ended with its agent, not on its own

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    async def stop(self, grace_period: float) -> None:
        if self._exit.done():
            return
        await self._send(wire.Stop(self.worker, max(0.0, grace_period)))
        with contextlib.suppress(asyncio.TimeoutError):
            await within(asyncio.shield(self._exit), grace_period + STOP_EXTRA_WAIT_S)

    async def inspect(self) -> ProcessView:
        """Its agent's answer (the caller bounds the wait: no answer, an unreachable host)."""
        if self._exit.done():
            return ProcessView(ProcessState.GONE)
        if self._inspected is None or self._inspected.done():
            self._inspected = asyncio.get_running_loop().create_future()
            await self._send(wire.Inspect(self.worker))
        return await asyncio.shield(self._inspected)

    # --- what the agent says about it ---------------------------------------------------------
    def heard(self, message: wire.Message) -> None:
        if isinstance(message, wire.Started):
            _settle(self.started, None)
        elif isinstance(message, wire.StartFailed):
            _settle(self.started, message.error)
            self._end(EXIT_AGENT_LOST)
        elif isinstance(message, wire.Output) and message.stream not in self._ended_streams:
            reader = self.stdout if message.stream == "stdout" else self.stderr
            if message.eof:
                self._ended_streams.add(message.stream)
                reader.feed_eof()
            else:
                reader.feed_data(wire.output_bytes(message))
        elif isinstance(message, wire.Exited):
            _settle(self.started, None)
            self._end(message.code)
        elif isinstance(message, wire.Inspected) and self._inspected is not None:
            _settle(self._inspected, ProcessView(ProcessState(message.state), message.detail))

    def relink(self, send: Send) -> None:
        """Its agent reconnected: messages go on the new connection."""
        self._send = send

    def lost(self) -> None:
        """Its agent is gone: so is it (an agent's workers never outlive it)."""
        _settle(self.started, "the agent went away")
        self.host_lost = not self._exit.done()
        self._end(EXIT_AGENT_LOST)

    def _end(self, code: int) -> None:
        for stream, reader in zip(wire.STREAMS, (self.stdout, self.stderr), strict=True):
            if stream not in self._ended_streams:
                self._ended_streams.add(stream)
                reader.feed_eof()
        _settle(self._exit, code)
        if self._inspected is not None:
            _settle(self._inspected, ProcessView(ProcessState.GONE))


T = TypeVar("T")


def _settle(future: asyncio.Future[T], value: T) -> None:
    if not future.done():
        future.set_result(value)
